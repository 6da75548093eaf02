"""The instruction list of one decode step: work items, their counters, and how they are dealt to programs.

An item is one row of int32 fields (ITEM_FIELDS):

    kind | a0 .. a7 (its arguments) | wait counter | wait need | wait total | done counter

It may start once `counters[wait counter] >= epoch * total + need` (`total`: the bumps that counter gets per step,
`epoch`: the steps run since the last reset, so no counter is cleared between steps), and it adds 1 to its done
counter when its writes are visible. A counter stands for a group of items (the tiles of one projection, the heads
of one mixer...): the group's consumers wait for all of it (need = total), or for one item of it (ATTN_SPLIT waits
for the ATTN_PREP of its KV head: a counter per KV head).

One decode step, per layer (sizes from the config; Qwen3.5-0.8B in brackets, for P = 132 programs):

    NORM (1) -> GEMV tiles of the in-projection (P) -> DELTANET per key head (16)
             -> GEMV_ADD tiles of out_proj (P) -> NORM -> GEMV tiles of gate_up (P) -> GEMV_SWIGLU tiles of down (P)
    or, split by value columns (deltanet_split = S > 1): the in-projection's tiles also run the causal conv of
    their q/k/v channels (GEMV_CONV), DELTANET_COLS per (key head, column split) (16 S), and the out_proj tiles
    compute the gated RMSNorm of their input from the splits' sums of squares (GEMV_ADD_GATED)
    NORM (1) -> GEMV tiles of qkv_proj (P) -> ATTN_PREP per KV head (2) -> ATTN_SPLIT per (KV head, split)
             -> ATTN_COMBINE per query head (8) -> GEMV_ADD tiles of o_proj (P) -> NORM -> gate_up -> down
    (with fold_prep no ATTN_PREP: the splits wait for the qkv tiles and prepare their queries themselves)
    then EMBED first, and last NORM -> GEMV_ARGMAX tiles of the LM head (P) -> ARGMAX (1).

With fuse_norms, no NORM item: each tile that reads the norm's output computes it from x itself (GEMV_NORM,
GEMV_NORM_ARGMAX: the sum of squares of x, then the normed input rounded where the NORM item would store it), so
the tiles wait for the residual stream's writers directly and a layer has two hops fewer on its critical path.

Every item waits on exactly one counter; every item is an ancestor of ARGMAX (which advances the token, the
position and the epoch), so when it runs every program has read the epoch and every reader of the token and the
position is done.

The order: items are listed in a dependency-respecting order (every wait's producers come earlier in the list), and
dealt to programs in that order, so each program's list is a subsequence of it. No deadlock then, as long as every
program is resident: the unfinished item with the smallest index among the programs' current items has all its
producers earlier in the list, hence finished (an unfinished one would be the current item of its program, or
behind it, with a smaller index). The deal is a list schedule: each item goes to the program that would finish it
first, from an estimate of its bytes read (`cost`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton

from ...config import LINEAR
from ...errors import KernelError

(EMBED, NORM, GEMV, GEMV_ADD, GEMV_SWIGLU, GEMV_ARGMAX, GEMV_NORM, GEMV_NORM_ARGMAX, GEMV_CONV, GEMV_NORM_CONV,
 GEMV_ADD_GATED, DELTANET, DELTANET_COLS, ATTN_PREP, ATTN_SPLIT, ATTN_COMBINE, ARGMAX) = range(17)
KIND_NAMES = ("EMBED", "NORM", "GEMV", "GEMV_ADD", "GEMV_SWIGLU", "GEMV_ARGMAX", "GEMV_NORM", "GEMV_NORM_ARGMAX",
              "GEMV_CONV", "GEMV_NORM_CONV", "GEMV_ADD_GATED", "DELTANET", "DELTANET_COLS", "ATTN_PREP",
              "ATTN_SPLIT", "ATTN_COMBINE", "ARGMAX")
GEMV_KINDS = range(GEMV, GEMV_ADD_GATED + 1)   # consecutive: the kernel compiles one form of gemv_item for each
NUM_ARGS = 8
WAIT_C, WAIT_NEED, WAIT_TOTAL, DONE_C = NUM_ARGS + 1, NUM_ARGS + 2, NUM_ARGS + 3, NUM_ARGS + 4
ITEM_FIELDS = NUM_ARGS + 5
# Fixed entries of the pointer table: the step's activation buffers (GEMV items name their input and output by slot)
X, H_SLOT, PROJ, GATE_UP, O_SLOT, LOGITS, DN_SS = range(7)
ITEM_OVERHEAD_BYTES = 64 * 1024   # an item's fixed cost in the deal's estimate (a counter round trip, ~1 us)


@dataclass
class Item:
    kind: int
    args: tuple
    wait: tuple | None      # (counter, need) or None
    done: int | None        # the counter bumped when done
    name: str
    cost: float             # bytes it reads (the deal's estimate)


@dataclass
class Schedule:
    """One decode step's instruction list on the device, and what the launcher and the error messages need."""
    items: torch.Tensor            # [n, ITEM_FIELDS] int32, in the dependency-respecting order
    order: torch.Tensor            # [n] int32: the items of program 0, then of program 1, ...
    starts: torch.Tensor           # [programs + 1] int32: program p runs order[starts[p]:starts[p + 1]]
    table: torch.Tensor            # [slots] int64: the addresses items reach by slot
    item_list: list[Item]
    counter_names: list[str]
    counter_totals: list[int]
    programs: int
    sizes: dict                    # constexprs of the kernel (every size from the config, the block shapes)
    buffers: dict                  # the step's scratch tensors by name
    keep: list = field(default_factory=list)   # tensors the table points into (alive as long as the schedule)
    fold_prep: bool = False        # no ATTN_PREP items: each ATTN_SPLIT norms and rotates for itself

    def program_lists(self) -> list[list[int]]:
        o, s = self.order.tolist(), self.starts.tolist()
        return [o[s[p]:s[p + 1]] for p in range(self.programs)]

    def describe(self, index: int) -> str:
        it = self.item_list[index]
        return f"item {index} ({KIND_NAMES[it.kind]} {it.name})"


class _Builder:
    def __init__(self, device):
        self.device = device
        self.slots: list[torch.Tensor] = []
        self.items: list[Item] = []
        self.counter_names: list[str] = []
        self.totals: list[int] = []

    def slot(self, t: torch.Tensor) -> int:
        self.slots.append(t)
        return len(self.slots) - 1

    def counter(self, name: str) -> int:
        self.counter_names.append(name)
        self.totals.append(0)
        return len(self.counter_names) - 1

    def add(self, kind, args, wait, done, name, cost):
        if done is not None:
            self.totals[done] += 1
        self.items.append(Item(kind, tuple(int(a) for a in args), wait, done, name, float(cost)))

    def gemv(self, kind, weight, name, w_slot, in_slot, out_slot, wait, tiles, norm_slot=-1, conv_base=None):
        """The tiles of out = weight @ in: `tiles` contiguous row ranges (as even as can be), one counter bumped by
        each; returns (the counter, its need). norm_slot: the norm weight of a GEMV_NORM kind (of GEMV_ADD_GATED:
        the gated norm's weight); conv_base: the conv weight's slot of a GEMV_CONV kind, in place of the tile's
        index (only the ARGMAX kinds read that)."""
        N, K = weight.shape
        if weight.stride() != (K, 1):
            raise KernelError(f"persistent schedule: weight {name} has strides {weight.stride()}, expected "
                              f"row-major ({K}, 1)")
        done = self.counter(f"{name} tiles")
        tiles = max(1, min(tiles, N))
        rows = triton.cdiv(N, tiles)
        t = 0
        for r0 in range(0, N, rows):
            n = min(rows, N - r0)
            self.add(kind, (w_slot, in_slot, out_slot, r0, n, K, t if conv_base is None else conv_base, norm_slot),
                     wait, done,
                     f"{name} rows {r0}..{r0 + n - 1}", n * K * weight.element_size())
            t += 1
        return done, self.totals[done]


def build_schedule(model, cache, programs: int, gemv_tiles: int | None = None, splits: int | None = None,
                   fuse_norms: bool = False, deltanet_split: int = 1, fold_prep: bool = False) -> Schedule:
    """The decode step of `model` (its config and weights) over `cache`, dealt to `programs` programs.

    gemv_tiles: tiles per projection (default: one per program, at least 2); splits: the attention's key splits per
    KV head (default: enough to give every program one, within the cache's key blocks); fuse_norms: the RMSNorms
    computed inside the tiles that read them (GEMV_NORM) instead of NORM items; deltanet_split: the DeltaNet
    heads' value columns in that many items each (1: one item per key head); fold_prep: no ATTN_PREP items, each
    ATTN_SPLIT waits for the qkv tiles and prepares its queries (and, holding key pos, the new key and value)."""
    from ..attention.tuning import _DECODE_BLOCK_N, _INTERP_DECODE_BLOCK_N, MAX_SPLITS
    from ... import runtime

    cfg, W, dev, dt = model.config, model.weights, model.device, model.dtype
    if programs < 1:
        raise KernelError(f"programs={programs!r}: expected a positive int")
    DV = cfg.linear_value_head_dim
    if not (isinstance(deltanet_split, int) and 1 <= deltanet_split <= DV):
        raise KernelError(f"deltanet_split={deltanet_split!r}: expected how many items share a DeltaNet head's "
                          f"{DV} value columns, an int from 1 to {DV}")
    tiles = gemv_tiles if gemv_tiles is not None else max(2, programs)
    block_n = _INTERP_DECODE_BLOCK_N if runtime.interpreter_active() else _DECODE_BLOCK_N
    L = cache.max_len
    Hkv = cfg.num_key_value_heads
    G = cfg.num_attention_heads // Hkv   # query heads per KV head
    if splits is None:
        splits = max(1, min(MAX_SPLITS, programs // Hkv, triton.cdiv(L, block_n)))
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    D = cfg.head_dim
    buffers = {
        "x": torch.zeros(H, device=dev, dtype=dt), "h": torch.zeros(H, device=dev, dtype=dt),
        "proj": torch.zeros(max(cfg.linear_in_proj_dim, cfg.attn_in_proj_dim), device=dev, dtype=dt),
        "gate_up": torch.zeros(2 * I, device=dev, dtype=dt),
        "o": torch.zeros(max(cfg.linear_value_dim, cfg.num_attention_heads * D), device=dev, dtype=dt),
        "logits": torch.zeros(V, device=dev, dtype=dt),
        "q": torch.zeros(cfg.num_attention_heads * D, device=dev, dtype=dt),
        "ws": torch.zeros(splits, cfg.num_attention_heads, D + 2, device=dev, dtype=torch.float32),
        # per (value head, column split): the sum of squares of its o columns, for the gated norm in out_proj
        "dn_ss": torch.zeros(cfg.linear_num_value_heads * deltanet_split, device=dev, dtype=torch.float32),
    }
    b = _Builder(dev)
    for name in ("x", "h", "proj", "gate_up", "o", "logits", "dn_ss"):   # slots X .. DN_SS
        b.slot(buffers[name])

    def normed_gemv(kind, weight, name, norm_weight, norm_name, out_slot, wait, conv_base=None):
        """The tiles of out = weight @ rmsnorm(x): after a NORM item, or (fuse_norms) each computing the norm.
        conv_base: the slot of a DeltaNet layer's conv weight (its conv state the next): the tiles run the conv."""
        w_slot = b.slot(weight)
        if fuse_norms:
            fused = {GEMV_ARGMAX: GEMV_NORM_ARGMAX, GEMV_CONV: GEMV_NORM_CONV}.get(kind, GEMV_NORM)
            return b.gemv(fused, weight, name, w_slot, X, out_slot, wait, tiles, b.slot(norm_weight), conv_base)
        c = b.counter(norm_name)
        b.add(NORM, (b.slot(norm_weight),), wait, c, norm_name, 4 * H)
        return b.gemv(kind, weight, name, w_slot, H_SLOT, out_slot, (c, 1), tiles, conv_base=conv_base)

    c = b.counter("embedding")
    b.add(EMBED, (b.slot(W.embed),), None, c, "token row", H * W.embed.element_size())
    wait = (c, 1)
    Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    for i, layer in enumerate(W.layers):
        tag = f"layer {i}"
        if layer.kind == LINEAR:
            base = b.slot(layer.conv)
            for t in (cache.conv_state[i], layer.A_log, layer.dt_bias, layer.norm, cache.recurrent_state[i]):
                b.slot(t)
            state_bytes = 2 * cfg.linear_key_head_dim * DV * 4 * (Hv // Hk)
            if deltanet_split == 1:
                wait = normed_gemv(GEMV, layer.in_proj, f"{tag} in_proj", layer.input_norm, f"{tag} input norm",
                                   PROJ, wait)
                c = b.counter(f"{tag} deltanet heads")
                for hk in range(Hk):
                    b.add(DELTANET, (base, hk, layer.conv.stride(0), layer.conv.stride(1)), wait, c,
                          f"{tag} deltanet key head {hk}", state_bytes)
                wait = b.gemv(GEMV_ADD, layer.out_proj, f"{tag} out_proj", b.slot(layer.out_proj), O_SLOT, X,
                              (c, Hk), tiles)
            else:
                if layer.conv.stride() != (1, layer.conv.shape[0]):   # the tiles' conv reads it column-major
                    raise KernelError(f"persistent schedule: layer {i}'s conv weight has strides "
                                      f"{layer.conv.stride()}, expected column-major (1, {layer.conv.shape[0]}) as "
                                      f"qwen_lab.weights lays it out")
                wait = normed_gemv(GEMV_CONV, layer.in_proj, f"{tag} in_proj", layer.input_norm,
                                   f"{tag} input norm", PROJ, wait, conv_base=base)
                c = b.counter(f"{tag} deltanet column splits")
                for hk in range(Hk):
                    for part in range(deltanet_split):
                        b.add(DELTANET_COLS, (base, hk, part), wait, c,
                              f"{tag} deltanet key head {hk} columns {part}", state_bytes / deltanet_split)
                wait = b.gemv(GEMV_ADD_GATED, layer.out_proj, f"{tag} out_proj", b.slot(layer.out_proj), O_SLOT, X,
                              (c, Hk * deltanet_split), tiles, norm_slot=base + 4)
        else:
            wait = normed_gemv(GEMV, layer.qkv_proj, f"{tag} qkv_proj", layer.input_norm, f"{tag} input norm", PROJ,
                               wait)
            base = b.slot(layer.q_norm)
            for t in (layer.k_norm, cache.key[i], cache.value[i]):
                b.slot(t)
            kv_bytes = 2 * L * D * cache.key[i].element_size() / max(1, splits)
            combined = b.counter(f"{tag} attention combine")
            for g in range(Hkv):
                split_wait = wait
                if not fold_prep:
                    prep = b.counter(f"{tag} attention prep kv head {g}")
                    b.add(ATTN_PREP, (base, g), wait, prep, f"{tag} attention prep kv head {g}", 4 * D)
                    split_wait = (prep, 1)
                split = b.counter(f"{tag} attention splits kv head {g}")
                for s in range(splits):
                    b.add(ATTN_SPLIT, (base, g, s), split_wait, split, f"{tag} attention kv head {g} split {s}",
                          kv_bytes)
                for h in range(g * G, (g + 1) * G):   # one per query head: G short items side by side
                    b.add(ATTN_COMBINE, (h,), (split, splits), combined, f"{tag} attention combine q head {h}",
                          4 * splits * (D + 2))
            wait = b.gemv(GEMV_ADD, layer.o_proj, f"{tag} o_proj", b.slot(layer.o_proj), O_SLOT, X,
                          (combined, Hkv * G), tiles)
        wait = normed_gemv(GEMV, layer.gate_up, f"{tag} gate_up", layer.post_norm, f"{tag} post-attention norm",
                           GATE_UP, wait)
        wait = b.gemv(GEMV_SWIGLU, layer.down, f"{tag} down", b.slot(layer.down), GATE_UP, X, wait, tiles)
    head, n_tiles = normed_gemv(GEMV_ARGMAX, W.lm_head, "lm_head", W.final_norm, "final norm", LOGITS, wait)
    b.add(ARGMAX, (), (head, n_tiles), None, "greedy token", 8 * n_tiles)
    buffers["best_val"] = torch.zeros(n_tiles, device=dev, dtype=torch.float32)
    buffers["best_idx"] = torch.zeros(n_tiles, device=dev, dtype=torch.int32)

    for name, t in (("conv_state", cache.conv_state), ("recurrent_state", cache.recurrent_state),
                    ("key", cache.key), ("value", cache.value)):
        for i, x in enumerate(t):
            if x is not None and not x.is_contiguous():   # the items compute their offsets from the sizes
                raise KernelError(f"persistent schedule: cache.{name}[{i}] is not contiguous; expected the Cache's "
                                  f"own tensor of shape {tuple(x.shape)}")
    for t in b.slots:
        if t.data_ptr() % 16:
            raise KernelError(f"persistent schedule: a tensor of shape {tuple(t.shape)} starts at an address that is "
                              f"not 16-byte aligned; the kernel's loads assume it is (a slice of another tensor?)")
    order, starts = deal(b.items, b.totals, programs)
    rows = []
    for it in b.items:
        args = list(it.args) + [0] * (NUM_ARGS - len(it.args))
        wc, need = it.wait if it.wait is not None else (-1, 0)
        rows.append([it.kind, *args, wc, need, b.totals[wc] if wc >= 0 else 0, -1 if it.done is None else it.done])
    sizes = kernel_sizes(cfg, splits, block_n, n_tiles, deltanet_split)
    sizes["ALIGNED"] = all(it.args[5] % 16 == 0 for it in b.items if it.kind in GEMV_KINDS)
    return Schedule(items=torch.tensor(rows, dtype=torch.int32, device=dev),
                    order=torch.tensor(order, dtype=torch.int32, device=dev),
                    starts=torch.tensor(starts, dtype=torch.int32, device=dev),
                    table=torch.tensor([t.data_ptr() for t in b.slots], dtype=torch.int64, device=dev),
                    item_list=b.items, counter_names=b.counter_names, counter_totals=b.totals, programs=programs,
                    sizes=sizes, buffers=buffers, keep=list(b.slots), fold_prep=fold_prep)


def kernel_sizes(cfg, splits: int, block_n: int, n_tiles: int, deltanet_split: int = 1) -> dict:
    """The persistent kernel's constexprs: the config's sizes and the block shapes that follow from them
    (DN_SPLIT: the items per DeltaNet head, DN_COLS their columns each, BS that to a power of two)."""
    dn_cols = triton.cdiv(cfg.linear_value_head_dim, deltanet_split)
    D = cfg.head_dim
    G = cfg.num_attention_heads // cfg.num_key_value_heads
    return dict(H=cfg.hidden_size, HK=cfg.linear_num_key_heads, HV=cfg.linear_num_value_heads,
                DK=cfg.linear_key_head_dim, DV=cfg.linear_value_head_dim, CW=cfg.linear_conv_kernel_dim,
                HQ=cfg.num_attention_heads, HKV=cfg.num_key_value_heads, D=D, HALF=cfg.rotary_dim // 2,
                NORM_BLOCK=min(1024, triton.next_power_of_2(cfg.hidden_size)),
                BK=triton.next_power_of_2(cfg.linear_key_head_dim),
                BV=min(32, triton.next_power_of_2(cfg.linear_value_head_dim)),
                BW=triton.next_power_of_2(max(cfg.linear_conv_kernel_dim - 1, 1)),
                REP_P=triton.next_power_of_2(cfg.linear_num_value_heads // cfg.linear_num_key_heads),
                ROWS=max(16, triton.next_power_of_2(G)), BLOCK_D=max(16, triton.next_power_of_2(D)),
                ATTN_BLOCK_N=block_n, SPLITS_P=triton.next_power_of_2(splits),
                TILES_P=min(1024, triton.next_power_of_2(n_tiles)), DN_SPLIT=deltanet_split, DN_COLS=dn_cols,
                BS=triton.next_power_of_2(dn_cols))


def deal(items: list[Item], totals: list[int], programs: int) -> tuple[list[int], list[int]]:
    """Deal the items, in their order, to programs: each to the program that would finish it first, the least loaded
    of those on a tie (list scheduling on the `cost` estimate: a program is free when its last item is done, an item
    is ready when its counter has reached its need). -> (order, starts)."""
    free = [0.0] * programs
    load = [0.0] * programs            # the bytes dealt to each program so far
    bumps = [[] for _ in totals]       # per counter: the finish times of its items so far
    lists = [[] for _ in range(programs)]
    for index, it in enumerate(items):
        ready = 0.0
        if it.wait is not None:
            c, need = it.wait
            times = sorted(bumps[c])
            if len(times) < need:
                raise KernelError(f"persistent schedule: item {index} ({KIND_NAMES[it.kind]} {it.name}) waits for "
                                  f"{need} bumps of a counter that only {len(times)} earlier items bump")
            ready = times[need - 1]
        # the earliest start; among programs idle by then, the least loaded (not always the first: it would take
        # every lone item, the norms, the heads, and sit on the critical path of each)
        p = min(range(programs), key=lambda q: (max(free[q], ready), load[q]))
        free[p] = max(free[p], ready) + it.cost + ITEM_OVERHEAD_BYTES
        load[p] += it.cost + ITEM_OVERHEAD_BYTES
        if it.done is not None:
            bumps[it.done].append(free[p])
        lists[p].append(index)
    order, starts = [], [0]
    for lst in lists:
        order += lst
        starts.append(len(order))
    return order, starts


def check_schedule(s: Schedule) -> None:
    """The schedule's promises, checked on the host: each program's list ascends in the item order; every wait's
    producers (enough of them to meet its need) come earlier in that order; every counter's per-step total is what
    its waits assume; every item but the last is an ancestor of the last (ARGMAX). Raises KernelError naming the
    item."""
    items = s.items.tolist()
    n = len(items)
    seen = sorted(s.order.tolist())
    if seen != list(range(n)):
        raise KernelError("persistent schedule: the programs' lists do not hold every item exactly once")
    for p, lst in enumerate(s.program_lists()):
        if any(a >= b for a, b in zip(lst, lst[1:])):
            raise KernelError(f"persistent schedule: program {p}'s items are not in the schedule's order: {lst}")
    bumped = [0] * len(s.counter_totals)
    producers = [[] for _ in s.counter_totals]
    for i, row in enumerate(items):
        wc, need, total, done = row[WAIT_C], row[WAIT_NEED], row[WAIT_TOTAL], row[DONE_C]
        if wc >= 0:
            if total != s.counter_totals[wc]:
                raise KernelError(f"persistent schedule: {s.describe(i)} assumes {total} bumps per step of counter "
                                  f"{wc} ({s.counter_names[wc]}), which gets {s.counter_totals[wc]}")
            if bumped[wc] < need:
                raise KernelError(f"persistent schedule: {s.describe(i)} waits for {need} bumps of counter {wc} "
                                  f"({s.counter_names[wc]}), but only {bumped[wc]} items before it bump it")
        if done >= 0:
            bumped[done] += 1
            producers[done].append(i)
    reach = {n - 1}
    for i in range(n - 1, -1, -1):   # walk back from the last item through the waits
        if i in reach and items[i][WAIT_C] >= 0:
            reach.update(producers[items[i][WAIT_C]])
    missing = [i for i in range(n) if i not in reach]
    if missing:
        raise KernelError(f"persistent schedule: {s.describe(missing[0])} is not an ancestor of the last item (it "
                          f"could still run when the step advances the epoch)")
