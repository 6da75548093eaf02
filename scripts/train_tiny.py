"""Train `tiny-english`, the CPU default model: Qwen3.5's architecture, small, trained on Jane Austen's novels.

    python scripts/train_tiny.py --device cuda       # the shipped model: about 5 minutes on one H100
    python scripts/train_tiny.py --device cpu --steps 30 --batch-size 4 --seq-len 128 --out build/tiny_english/cpu

What it does, in order (seeded: the same command gives the same tokenizer, batches and initial weights):
1. The corpus. `scripts/austen_corpus.py` runs `apt-get download r-cran-janeaustenr` (Debian's janeaustenr: the six
   novels, public domain, packaged under the MIT licence; the text lies in the package's R lazy-load database
   usr/lib/R/site-library/janeaustenr/data/Rdata.rdb) and writes the cleaned prose to --corpus (4 MB, 730k words),
   unless that file exists. The corpus is not in the repository; on a machine without the Debian registry, bring
   the file along.
2. The held-out split: every 20th block of 40 paragraphs of each novel (5% of the text) is never trained on.
3. A byte-level BPE of --vocab-size tokens, trained on the training text with the `tokenizers` library: Qwen's
   pre-tokenizer and byte alphabet, the special tokens <|endoftext|>, <|im_start|>, <|im_end|> at the top ids (as
   in the tiny model), the tiny model's ChatML template.
4. The training stream: the novels' paragraphs, each novel closed by <|endoftext|>, and the novels' exchanges of
   dialogue (a quoted paragraph answered by a quoted paragraph) written as ChatML user/assistant turns, so that
   the chat notebook gets a reply in words that ends at <|im_end|>.
5. The model: config.TINY_ENGLISH (4 layers, 3 Gated DeltaNet + 1 gated attention, hidden 256, 3.3 M
   parameters) as transformers' Qwen3_5ForCausalLM, trained with AdamW on random windows of the stream (bf16
   autocast on a GPU). The held-out loss is measured every --eval-every steps; the weights of the best one are kept.
6. The snapshot, in the real Hugging Face layout (what `save_pretrained` writes for a tied Qwen3_5ForCausalLM):
   config.json, model.safetensors (bf16; A_log and the gated norm in fp32, as in the released checkpoints; about
   6.6 MB), tokenizer.json, tokenizer_config.json, generation_config.json and a README.md model card, in --out.
   Then the held-out loss of the written bf16 weights and a few greedy and sampled continuations are printed.

Time: on one H100, a few minutes for the default 2000 steps (the transformers model runs its PyTorch Gated
DeltaNet; --max-minutes stops earlier, and the card records the step reached). On a CPU the --steps 30 smoke run
above takes under a minute on 2 cores (0.14 s a step at batch 4 x 128 on an idle machine, ten times that on a
busy one); the default run (batch 32 x 256: 16 times the tokens a step) would take about 2000 x 16 x 0.14 s, some
75 minutes, on 2 idle cores (pass --device cpu --max-minutes 90). A shorter CPU recipe reaches the same held-out
loss: `--device cpu --steps 600 --batch-size 16 --warmup 60 --eval-windows 64` took 2035 s on 2 threads for 3.993
nats per token (the shipped GPU run: 3.992 at step 500 of 2000, 211 s on an H100).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from austen_corpus import NOVELS, PACKAGE, write_corpus  # noqa: E402

from qwen_lab.config import TINY_ENGLISH, Qwen35Config  # noqa: E402
from qwen_lab.export import save_snapshot, write_json  # noqa: E402
from qwen_lab.tiny import _pre_tokenizer, bytes_to_unicode, tokenizer_json, write_tokenizer  # noqa: E402

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BLOCK_PARAGRAPHS, HELD_OUT_EVERY = 40, 20
PROMPTS = ("It is a truth universally acknowledged, that", "The weather was so fine that", "She had never seen",
           "\"My dear Emma,\" said Mr. Knightley,")
CHAT_PROMPT = "What do you think of him?"


# ------------------------------------------------------------------ the text


def read_novels(path: Path) -> list[list[str]]:
    """The corpus file -> novels (split at two blank lines), each a list of paragraphs (split at one)."""
    novels = [[p for p in n.split("\n\n") if p.strip()] for n in path.read_text(encoding="utf-8").split("\n\n\n")]
    novels = [n for n in novels if n]
    if len(novels) != len(NOVELS):
        raise ValueError(f"{path}: {len(novels)} novels (parts between two blank lines), expected {len(NOVELS)}; "
                         "rewrite it with scripts/austen_corpus.py")
    return novels


def split_held_out(novels: list[list[str]]) -> tuple[list[list[str]], list[list[str]]]:
    """(train, held-out) paragraphs of each novel: every HELD_OUT_EVERY-th block of BLOCK_PARAGRAPHS is held out."""
    train, held = [], []
    for paragraphs in novels:
        t, h = [], []
        for start in range(0, len(paragraphs), BLOCK_PARAGRAPHS):
            block = paragraphs[start:start + BLOCK_PARAGRAPHS]
            (h if (start // BLOCK_PARAGRAPHS) % HELD_OUT_EVERY == HELD_OUT_EVERY // 2 else t).extend(block)
        train.append(t)
        held.append(h)
    return train, held


def _speech(paragraph: str) -> str | None:
    """The words of a paragraph that is one quotation and nothing else, without its quotes; None otherwise."""
    p = paragraph.strip()
    if len(p) > 2 and p[0] == '"' and p[-1] == '"' and p.count('"') == 2:
        return p[1:-1].strip()
    return None


def documents(novels: list[list[str]]) -> list[str]:
    """The training documents: each novel's prose, then its dialogue exchanges as ChatML turns."""
    docs = ["\n\n".join(paragraphs) + "<|endoftext|>" for paragraphs in novels]
    for paragraphs in novels:
        for a, b in zip(paragraphs, paragraphs[1:]):
            q, r = _speech(a), _speech(b)
            if q and r:
                docs.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{r}<|im_end|>\n<|endoftext|>")
    return docs


# ------------------------------------------------------------------ the tokenizer


def train_tokenizer(novels: list[list[str]], vocab_size: int) -> dict:
    """A tokenizer.json dict: byte-level BPE with vocab_size - 3 learned tokens and the special tokens on top."""
    from tokenizers import Tokenizer, models, normalizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), min_frequency=2, show_progress=False,
                                  initial_alphabet=sorted(bytes_to_unicode().values()), special_tokens=[])
    tok.train_from_iterator((p for paragraphs in novels for p in paragraphs), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if sorted(vocab.values()) != list(range(vocab_size - len(SPECIAL_TOKENS))):
        raise ValueError(f"the BPE trainer gave {len(vocab)} tokens, expected ids 0..{vocab_size - 4}: the text is "
                         "too short for this --vocab-size")
    return tokenizer_json(vocab, merges, special_ids(vocab_size))


def special_ids(vocab_size: int) -> dict[str, int]:
    return {t: vocab_size - len(SPECIAL_TOKENS) + i for i, t in enumerate(SPECIAL_TOKENS)}


def encode(tokenizer_file: Path, docs: list[str]) -> torch.Tensor:
    """All documents' token ids, one after another, as a 1-D int64 tensor."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    ids = [i for enc in tok.encode_batch(docs, add_special_tokens=False) for i in enc.ids]
    return torch.tensor(ids, dtype=torch.long)


# ------------------------------------------------------------------ the model


def hf_model(config: Qwen35Config, seed: int, device: str):
    """transformers' Qwen3_5ForCausalLM for `config`, initialised by transformers from `seed`, in fp32."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    d = {k: v for k, v in config.to_hf_dict().items() if k not in ("architectures", "model_type", "torch_dtype")}
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM._from_config(Qwen3_5TextConfig(**d), attn_implementation="sdpa", dtype=torch.float32)
    return model.to(device)


def shipped_state(model) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors: the causal-LM names without the tied lm_head; bf16, but A_log and the gated norm
    in fp32 as the released checkpoints store them."""
    out = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        keep_fp32 = name.endswith(".A_log") or name.endswith("linear_attn.norm.weight")
        out[name] = t.detach().to("cpu", torch.float32 if keep_fp32 else torch.bfloat16).contiguous()
    return out


@torch.no_grad()
def held_out_loss(model, ids: torch.Tensor, seq_len: int, batch_size: int, max_windows: int, device: str) -> float:
    """Mean next-token cross-entropy (nats) over non-overlapping windows of the held-out stream."""
    model.eval()
    n = min(max_windows, (ids.numel() - 1) // seq_len)
    starts = torch.arange(n) * seq_len
    total, count = 0.0, 0
    for i in range(0, n, batch_size):
        s = starts[i:i + batch_size]
        x = torch.stack([ids[j:j + seq_len] for j in s]).to(device)
        y = torch.stack([ids[j + 1:j + seq_len + 1] for j in s]).to(device)
        with _autocast(device):
            logits = model(input_ids=x).logits
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / max(count, 1)


def _autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast(
        "cpu", enabled=False)


@torch.no_grad()
def continue_text(model, tok, text: str, n: int, temperature: float, top_p: float, seed: int, device: str) -> str:
    """`n` tokens after `text` (greedy at temperature 0, else nucleus sampling from `seed`), no cache: a check."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    ids = tok.encode(text, add_special_tokens=False).ids
    new = []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids + new], device=device)).logits[0, -1].float().cpu()
        if temperature == 0:
            t = int(logits.argmax())
        else:
            p = torch.softmax(logits / temperature, -1)
            sp, si = p.sort(descending=True)
            keep = sp.cumsum(0) - sp < top_p
            t = int(si[keep][torch.multinomial(sp[keep] / sp[keep].sum(), 1, generator=g)])
        new.append(t)
        if t == tok.token_to_id("<|im_end|>") or t == tok.token_to_id("<|endoftext|>"):
            break
    return tok.decode(new, skip_special_tokens=False)


# ------------------------------------------------------------------ training


def train(args) -> dict:
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    corpus = Path(args.corpus)
    if not corpus.is_file():
        print(f"{corpus}: fetching the corpus (apt-get download {PACKAGE})", flush=True)
        write_corpus(corpus)
    train_novels, held_novels = split_held_out(read_novels(corpus))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = TINY_ENGLISH.replace(vocab_size=args.vocab_size, eos_token_ids=(args.vocab_size - 1, args.vocab_size - 3),
                                  pad_token_id=args.vocab_size - 3)

    t0 = time.perf_counter()
    specials = special_ids(args.vocab_size)
    write_tokenizer(out, train_tokenizer(train_novels, args.vocab_size), specials)
    train_ids = encode(out / "tokenizer.json", documents(train_novels))
    held_ids = encode(out / "tokenizer.json", documents(held_novels))
    print(f"tokenizer: {args.vocab_size} tokens, {time.perf_counter() - t0:.1f} s; training stream "
          f"{train_ids.numel():,} tokens, held-out {held_ids.numel():,}", flush=True)

    device = args.device
    model = hf_model(config, args.seed, device)
    n_params = sum(p.numel() for p in model.parameters())  # (the tied head is the embedding: counted once)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            fused=device.startswith("cuda"))

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))

    gen = torch.Generator().manual_seed(args.seed)
    best = (math.inf, -1, None)
    history = []
    t_train = time.perf_counter()
    step = 0
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, train_ids.numel() - args.seq_len - 1, (args.batch_size,), generator=gen)
        window = torch.stack([train_ids[s:s + args.seq_len + 1] for s in starts]).to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step - 1)
        with _autocast(device):
            logits = model(input_ids=window[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.perf_counter() - t_train
        last = step == args.steps or elapsed > args.max_minutes * 60
        if step % args.eval_every == 0 or last:
            held = held_out_loss(model, held_ids, args.seq_len, args.batch_size, args.eval_windows, device)
            history.append((step, round(loss.item(), 4), round(held, 4)))
            print(f"step {step:5d}  train loss {loss.item():.3f}  held-out loss {held:.3f}  "
                  f"({elapsed:.0f} s, {elapsed / step:.3f} s/step)", flush=True)
            if held < best[0]:
                best = (held, step, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        if last:
            break
    train_s = time.perf_counter() - t_train
    model.load_state_dict(best[2])

    state = shipped_state(model)
    save_snapshot(out, config, state)
    write_json(out / "generation_config.json", {"eos_token_id": list(config.eos_token_ids),
                                                "pad_token_id": config.pad_token_id, "do_sample": False})
    # what ships is bf16: measure and sample with the rounded weights
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    shipped_held = held_out_loss(model, held_ids, args.seq_len, args.batch_size, args.eval_windows, device)
    report = {"steps": step, "best_step": best[1], "held_out_loss": round(best[0], 4),
              "held_out_loss_bf16": round(shipped_held, 4), "train_seconds": round(train_s, 1),
              "seconds_per_step": round(train_s / max(step, 1), 4), "parameters": n_params,
              "train_tokens": train_ids.numel(), "held_out_tokens": held_ids.numel(), "device": _device_name(device),
              "history": history, "args": vars(args), "command": command_line(args)}
    samples = sample_texts(model, out, device)
    write_card(out, config, report, samples)
    return report


def sample_texts(model, out: Path, device: str) -> list[tuple[str, str, str]]:
    """(prompt, how, continuation) for each prompt, greedy and at temperature 0.8 / top-p 0.9, and a chat turn."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    rows = []
    for prompt in PROMPTS:
        rows.append((prompt, "greedy", continue_text(model, tok, prompt, 32, 0.0, 1.0, 0, device)))
        for seed in (0, 1):
            rows.append((prompt, f"T=0.8 top-p 0.9 seed {seed}",
                         continue_text(model, tok, prompt, 32, 0.8, 0.9, seed, device)))
    chat = f"<|im_start|>user\n{CHAT_PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    rows.append((CHAT_PROMPT, "chat, greedy", continue_text(model, tok, chat, 48, 0.0, 1.0, 0, device)))
    return rows


def command_line(args) -> str:
    """The command that trains this model again: the options that differ from the defaults (not --out, --corpus)."""
    defaults = vars(main_parser().parse_args([]))
    changed = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
               if k not in ("out", "corpus") and v != defaults[k]]
    return " ".join(["python scripts/train_tiny.py", *changed])


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({torch.get_num_threads()} threads)"


def write_card(out: Path, config: Qwen35Config, report: dict, samples) -> None:
    """README.md: what the model is, where its text came from, how it was trained, what it writes."""
    a = report["args"]
    size = (out / "model.safetensors").stat().st_size
    lines = [
        "# tiny-english",
        "",
        f"A {report['parameters'] / 1e6:.1f} M-parameter model of the Qwen3.5 architecture ({config.num_hidden_layers} "
        f"layers: {config.num_linear_layers} Gated DeltaNet, {config.num_full_layers} gated attention; hidden "
        f"{config.hidden_size}, a {config.vocab_size}-token byte-level BPE), trained on Jane Austen's novels. It is "
        "qwen_lab's default model on a CPU: small enough for the Triton interpreter, trained enough to write English.",
        "",
        "## Data",
        "",
        f"Debian's package `{PACKAGE}` (janeaustenr 1.0.0 by Julia Silge, MIT licence): `apt-get download {PACKAGE}`. "
        "The text of the six novels (Sense and Sensibility, Pride and Prejudice, Mansfield Park, Emma, Northanger "
        "Abbey, Persuasion; public domain, from Project Gutenberg) lies in its R lazy-load database "
        "`usr/lib/R/site-library/janeaustenr/data/Rdata.rdb`; `scripts/austen_corpus.py` reads it without R and "
        f"cleans it. Every {HELD_OUT_EVERY}th block of {BLOCK_PARAGRAPHS} paragraphs is held out "
        f"({report['held_out_tokens']:,} tokens; {report['train_tokens']:,} for training, with the novels' "
        "exchanges of dialogue also written as ChatML turns).",
        "",
        "## Training",
        "",
        f"`{report['command']}` (seed {a['seed']}): transformers' Qwen3_5ForCausalLM, AdamW "
        f"(lr {a['lr']}, weight decay {a['weight_decay']}, {a['warmup']} warm-up steps, cosine), batch "
        f"{a['batch_size']} x {a['seq_len']} tokens, {report['steps']} steps in {report['train_seconds']:.0f} s on "
        f"{report['device']}. The weights of step {report['best_step']}, the lowest held-out loss, are kept.",
        "",
        f"Held-out loss: {report['held_out_loss']:.3f} nats per token ({report['held_out_loss_bf16']:.3f} with the "
        f"shipped bf16 weights). model.safetensors: {size / 2**20:.1f} MiB.",
        "",
        "## What it writes",
        "",
        "Continuations of 32 tokens by the training model (transformers, fp32 math on the bf16 weights):",
        "",
    ]
    for prompt, how, text in samples:
        lines.append(f"- *{how}*: {prompt!r} -> {text!r}")
    lines += ["", "## Files", "",
              "config.json, model.safetensors (the Hugging Face causal-LM layout, tied head), tokenizer.json, "
              "tokenizer_config.json (ChatML template), generation_config.json. Loss history (step, train, held-out): "
              f"{report['history']}.", ""]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


def main_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/train_tiny.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=str(ROOT / "build" / "tiny_english" / "corpus.txt"),
                   help="the cleaned novels; fetched with scripts/austen_corpus.py when missing (default: %(default)s)")
    p.add_argument("--out", default=str(ROOT / "qwen_lab" / "data" / "tiny_english"),
                   help="where the snapshot is written (default: the package's copy, %(default)s)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--max-minutes", type=float, default=5.5, help="stop training after this long (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-windows", type=int, default=256, help="held-out windows per evaluation (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=TINY_ENGLISH.vocab_size)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv=None) -> int:
    args = main_parser().parse_args(argv)
    t0 = time.perf_counter()
    report = train(args)
    print(f"held-out loss {report['held_out_loss']:.4f} (bf16 weights: {report['held_out_loss_bf16']:.4f}) at step "
          f"{report['best_step']} of {report['steps']}; {report['seconds_per_step']:.3f} s/step on {report['device']}; "
          f"{time.perf_counter() - t0:.0f} s in all")
    print((Path(args.out) / "README.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
