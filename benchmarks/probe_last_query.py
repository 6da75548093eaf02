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

from probe_ab import model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__, ("--rounds", dict(type=int, default=3)), model=False)
    if args is None:
        return 0
    from qwen_lab import bench, checks
    from qwen_lab.model import load_model

    model = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)

    def switch(on: bool) -> None:   # off: an instance attribute in place of the route's test
        if on:
            model.__dict__.pop("_projects_last_query", None)
        else:
            model._projects_last_query = lambda *a: False

    model_ab(switch, "last query apart", args.tokens, rounds=args.rounds, model=model)
    T = 512
    ids = torch.randint(0, model.config.vocab_size, (T,), generator=torch.Generator().manual_seed(1)).cuda()
    hf32 = bench.transformers_model(model.config, model.weights, "cuda", torch.float32)
    with torch.inference_mode():
        truth = hf32(input_ids=ids[None]).logits[0, -1].float()
    del hf32
    got = {}
    for on in (False, True):
        switch(on)
        with torch.inference_mode():
            got[on] = model.step(ids, torch.arange(T, device="cuda"), model.new_cache(T))[0].float()
        print(f"last logits, last query apart={on}, against transformers float32: relative error "
              f"{checks.relative_error(got[on], truth):.2e}, argmax {'same' if got[on].argmax() == truth.argmax() else 'differs'}",
              flush=True)
    print(f"on against off: relative error {checks.relative_error(got[True], got[False]):.2e}", flush=True)
    switch(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
