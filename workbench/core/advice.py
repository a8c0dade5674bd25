"""The score from which an op stands out of its peers' noise: the catalog's views, the verdicts and the summary share it
(the advisor's rules are in `analysis/verdicts/causes.py`)."""

from __future__ import annotations

# A score (error an op adds / what its peers add) from which an op clearly stands out of the noise:
# `wb compare` names it as the most likely origin only from here on.
STANDS_OUT = 3.0
# The score of an op whose output holds NaN/Inf its inputs do not: ranked before any finite error, shown as `NaN/Inf`.
NAN_INF_SCORE = 1.0e9


def score_text(score: float) -> str:
    """An advisor score as shown: one decimal, `NaN/Inf` for NaN/Inf born in the op (`NAN_INF_SCORE`)."""
    return "NaN/Inf" if score >= NAN_INF_SCORE else f"{score:.1f}"


# What the advisor's reason says of an op with no peers (no same op in other layers, no op of its type) that is no
# lookup: its score is over twice its dtype's rounding; the app's detail says so instead of "its peers' noise".
NO_PEERS = "for want of peers"


def born_in_noise(score: float | None, evidence: str | None = None, inside: float | None = None) -> str | None:
    """What `wb compare`, the HTML report and the app add under an op whose outputs fail while its inputs pass, when
    the advisor scores it under `STANDS_OUT`: the thresholds caught it, but it adds no more than the same op
    elsewhere (peers that are all as wrong, one faulty kernel in every layer, look the same). None where the advisor
    did not rank it, it or an op inside it (`inside`: the highest score there) stands out, or evidence (a precheck)
    says more."""
    if score is None or score >= STANDS_OUT or evidence or (inside is not None and inside >= STANDS_OUT):
        return None
    return (
        f"the advisor scores it {score:.1f} (under {STANDS_OUT:g}: inside its peers' noise), so the run's own "
        "rounding may be what crosses the thresholds here, or a fault that every op of its kind shares"
    )


def added_inside(score: float | None, inside_name: str | None, inside_score: float | None) -> str | None:
    """What is said under a born op that does not stand out itself while an op inside it does: the advisor scores a
    module only for the error none of its child ops explains, so a child adding it all leaves the module near 0."""
    if inside_name is None or inside_score is None or inside_score < STANDS_OUT:
        return None
    if score is not None and score >= inside_score:
        return None
    return (
        f"most of it is added inside it, by {inside_name}: the advisor scores that op {score_text(inside_score)} "
        f"(>= {STANDS_OUT:g}: stands out)"
    )


def elsewhere(name: str, score: float, token: int) -> str:
    """What follows `born_in_noise`'s note where the advisor's first op at that token is another op that stands out."""
    return (
        f"the advisor's most likely origin here is {name} (score {score_text(score)}, >= {STANDS_OUT:g}: stands out; "
        f"`wb advise -t {token}`)"
    )
