"""The state the fused metric kernels keep for one golden/test pair: a float64 array laid out by the `S_*`/`P_*`
offsets below, and how the states of consecutive parts of a pair merge. Plain numpy: reading a state out needs no
compiled code."""

from __future__ import annotations

import numpy as np

SERIES_MAX = 0.1  # largest |m - g| for which the KL's series form for expm1(d) - d holds (truncation < 3e-7)

# side statistics: golden at G_SIDE, test at M_SIDE, each S_LEN slots
S_DECIDED, S_SHIFT, S_N, S_S1, S_S2, S_LO, S_HI = range(7)
S_LEN = 7
G_SIDE, M_SIDE = 0, S_LEN
# pair sums (over the positions finite on both sides)
_P = 2 * S_LEN
P_N, P_DOT, P_GG, P_MM, P_D2 = _P, _P + 1, _P + 2, _P + 3, _P + 4
P_REL_MAX, P_REL_SUM, P_ABS_MAX, P_ABS_SUM, P_N_LT1, P_N_LT5 = _P + 5, _P + 6, _P + 7, _P + 8, _P + 9, _P + 10
P_ULP_MAX, P_D_MAX = _P + 11, _P + 12
P_KL_G, P_KL_Z, P_KL_A, P_KL_B, P_KL_M, P_KL_ZM = _P + 13, _P + 14, _P + 15, _P + 16, _P + 17, _P + 18
STATE_LEN = _P + 19


def new_state() -> np.ndarray:
    """An empty pair state."""
    st = np.zeros(STATE_LEN, np.float64)
    for side in (G_SIDE, M_SIDE):
        st[side + S_LO], st[side + S_HI] = np.inf, -np.inf
    st[P_KL_G] = st[P_KL_M] = -np.inf
    return st


def merge_state(into: np.ndarray, part: np.ndarray) -> None:
    """Add the state of a later part of the pair (`part`) to `into`: both as one pass over both parts would hold
    them, up to the rounding of the float64 sums (a side's sums are moved to `into`'s shift)."""
    for side in (G_SIDE, M_SIDE):
        if part[side + S_N] == 0:
            continue
        if into[side + S_DECIDED] == 0.0:
            into[side + S_DECIDED], into[side + S_SHIFT] = 1.0, part[side + S_SHIFT]
        n, s1 = part[side + S_N], part[side + S_S1]
        delta = part[side + S_SHIFT] - into[side + S_SHIFT]  # x - c_into = (x - c_part) + delta
        into[side + S_N] += n
        into[side + S_S1] += s1 + n * delta
        into[side + S_S2] += part[side + S_S2] + 2.0 * delta * s1 + n * delta * delta
        into[side + S_LO] = min(into[side + S_LO], part[side + S_LO])
        into[side + S_HI] = max(into[side + S_HI], part[side + S_HI])
    if part[P_N] == 0:
        return
    for slot in (P_N, P_DOT, P_GG, P_MM, P_D2, P_REL_SUM, P_ABS_SUM, P_N_LT1, P_N_LT5):
        into[slot] += part[slot]
    for slot in (P_REL_MAX, P_ABS_MAX, P_ULP_MAX, P_D_MAX):
        into[slot] = max(into[slot], part[slot])
    # the KL's sums against the larger running max of each side (an empty `into` has -inf: its factor is 0)
    top = max(into[P_KL_G], part[P_KL_G])
    k_into, k_part = np.exp(into[P_KL_G] - top), np.exp(part[P_KL_G] - top)
    for slot in (P_KL_Z, P_KL_A, P_KL_B):
        into[slot] = into[slot] * k_into + part[slot] * k_part
    into[P_KL_G] = top
    top_m = max(into[P_KL_M], part[P_KL_M])
    into[P_KL_ZM] = into[P_KL_ZM] * np.exp(into[P_KL_M] - top_m) + part[P_KL_ZM] * np.exp(part[P_KL_M] - top_m)
    into[P_KL_M] = top_m
