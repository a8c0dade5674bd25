"""Facts the root-cause advisor (`analysis/advisor.py`) and the compare summary share."""

from __future__ import annotations

# A score (error an op adds / what its peers add) from which an op clearly stands out of the noise:
# `wb compare` names it as the most likely origin only from here on.
STANDS_OUT = 3.0

# Unit roundoff of a test dtype: the relative error one rounding of an output adds.
ROUNDING: dict[str, float] = {
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
    "int8": 2.0**-8,
}
