"""The score from which an op stands out of its peers' noise: the catalog's views, the verdicts and the summary share it
(the advisor's rules are in `analysis/verdicts/causes.py`)."""

from __future__ import annotations

# A score (error an op adds / what its peers add) from which an op clearly stands out of the noise:
# `wb compare` names it as the most likely origin only from here on.
STANDS_OUT = 3.0
