"""Probe: the last attention layer of a prompt projects q and its gate for the last row alone, against every row.

    python benchmarks/probe_last_query.py [--tokens 2048] [--rounds 3]   (an NVIDIA GPU; prints one line per run)

A prefill returns the last position's logits, and Qwen3.5's last layer is gated attention: its keys and values go
to the cache for every token, but only the last token's query attends. `Qwen35Model.project_last_query` therefore
splits that layer's fused projection (1024 -> 5120 on the 0.8B model) into a GEMM of the k and v columns for every
row (1024 -> 1024) and a one-row GEMV of the q and gate columns (1024 -> 4096), and the q/k preparation prepares
one query. Expected at 2048 tokens: the 32 us projection GEMM becomes ~8 us of GEMM and ~4 us of GEMV, and the
q/k preparation loses the queries' half of its programs.

The model's prefill and decode both ways, alternated (`probe_ab.model_ab`: the triton + cuda-graph row of
`qwen_lab.bench`); then the last position's logits of a 512-token prompt both ways, each against transformers in
float32 on the same weights.
"""

import sys

import torch

from probe_ab import last_logits_ab, model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__, ("--rounds", dict(type=int, default=3)), model=False)
    if args is None:
        return 0
    from qwen_lab.model import load_model

    model = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)

    def switch(on: bool) -> None:   # off: an instance attribute in place of the route's test
        if on:
            model.__dict__.pop("_projects_last_query", None)
        else:
            model._projects_last_query = lambda *a: False

    model_ab(switch, "last query apart", args.tokens, rounds=args.rounds, model=model)
    last_logits_ab(model, switch, "last query apart")
    switch(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
