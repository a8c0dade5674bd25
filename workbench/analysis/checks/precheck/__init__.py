"""Single-op precheck: re-run one op alone on its dumped inputs against a high-precision reference.

`atb_inputs` / `torch_inputs` read a dump, `atb_kernels` / `torch_kernels` recompute ops (their `CHECKERS`),
`atb_peers` audits an ATB op's params against its token's peers, `judge` judges a reference against a dumped
output, `run_atb` / `run_torch` / `run_catalog` are the entry points and `result` is what they return
(torch-free: the app imports only it, so this file imports nothing).
"""
