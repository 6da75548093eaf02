"""The mutation suite's list: plausible bugs in the library, each with the tests that must catch it.

A mutant names a file under qwen_lab/, a snippet that occurs exactly once in it, the snippet's replacement, the bug
in one line, and the narrowest tests that fail when it is planted (pytest node ids, relative to the repository).
tests/test_mutations.py plants each one in a copy of the package and runs those tests; the suite fails if any
mutant survives or if a snippet no longer matches (then the source moved: update the snippet here).

To add a mutant: copy an entry, quote the source exactly (indentation inside the snippet included), name the
narrowest test that must fail, and try it alone with
    QWEN_LAB_MUTANTS=its_name python -m pytest -q tests/test_mutations.py
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str                 # under qwen_lab/
    find: str                 # occurs exactly once in the file
    replace: str
    bug: str                  # the plausible bug, in one line
    tests: tuple[str, ...]    # pytest node ids that must fail


def _m(name, file, find, replace, bug, *tests):
    return Mutant(name, file, find, replace, bug, tuple(tests))


EMB = "tests/test_embedding.py::"
NORM = "tests/test_norms.py::"
GEMM = "tests/test_gemm.py::"
ACT = "tests/test_activations.py::"
ROPE = "tests/test_rope.py::"
ATT = "tests/test_attention.py::"
CONV = "tests/test_conv1d.py::"
DN = "tests/test_deltanet.py::"
DNR = "tests/test_deltanet_recurrent.py::"
PERS = "tests/test_persistent.py::"
DNC = "tests/test_deltanet_chunked.py::"
SAMP = "tests/test_sampling.py::"
MODEL = "tests/test_model.py::"

MUTANTS: list[Mutant] = [
    # ---------------------------------------------------------------- embedding
    _m("embedding_id_bound", "kernels/embedding/gather.py",
       "(ids >= 0) & (ids < V)", "(ids >= 0) & (ids <= V)",
       "an id equal to the vocabulary size reads the row past the table",
       EMB + "test_out_of_range_ids_give_zero_rows_and_never_read_outside"),

    # ---------------------------------------------------------------- norms
    _m("rms_norm_one_plus_w", "kernels/norms/rmsnorm.py",
       "y = (x * _inv_rms(x, D, eps)[:, None]) * (1.0 + w)[None, :]",
       "y = (x * _inv_rms(x, D, eps)[:, None]) * w[None, :]",
       "the zero-centred norm multiplies by w instead of (1 + w)",
       NORM + "test_rms_norm_is_zero_centred"),
    _m("rms_norm_eps_dropped", "kernels/norms/rmsnorm.py",
       "return tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)",
       "return tl.math.rsqrt(tl.sum(x * x, axis=1) / D)",
       "the norm's eps is dropped",
       NORM + "test_rms_norm_eps_matters"),
    _m("rms_norm_eps_before_the_mean", "kernels/norms/rmsnorm.py",
       "return tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)",
       "return tl.math.rsqrt((tl.sum(x * x, axis=1) + eps) / D)",
       "eps is added to the sum of squares before the division by D",
       NORM + "test_rms_norm_eps_matters"),
    _m("add_rms_norm_normalises_the_fp32_sum", "kernels/norms/rmsnorm.py",
       "    sf = s.to(tl.float32)\n",
       "    sf = x.to(tl.float32) + r.to(tl.float32)\n",
       "the fused add + norm normalises the fp32 sum, not the residual as stored (rounded)",
       NORM + "test_add_rms_norm_normalises_the_stored_residual"),
    _m("gated_norm_one_plus_w", "kernels/norms/rmsnorm.py",
       "* w[None, :]) * gate", "* (1.0 + w)[None, :]) * gate",
       "the gated norm takes the zero-centred (1 + w) instead of the plain weight",
       NORM + "test_gated_norm_uses_plain_weight"),
    _m("teach_rms_norm_one_plus_w", "kernels/norms/teach.py",
       "y = (x * inv_rms[:, None]) * (1.0 + w)[None, :]", "y = (x * inv_rms[:, None]) * w[None, :]",
       "the notebook's norm multiplies by w instead of (1 + w)",
       NORM + "test_the_teaching_kernels_match_the_reference"),

    # ---------------------------------------------------------------- gemm
    _m("tiled_k_mask_off_by_one", "kernels/gemm/tiled.py",
       "k_left = K - k0  #", "k_left = K - k0 - 1  #",
       "the prompt GEMM's K mask drops the last column of a ragged K",
       GEMM + "test_linear_matches_reference"),
    _m("splitk_deterministic_partial_lost", "kernels/gemm/gemv.py",
       "for s in range(SPLIT_K):", "for s in range(1, SPLIT_K):",
       "the deterministic split-K reduction skips the first split's partial",
       GEMM + "test_splitk_matches_reference"),
    _m("splitk_atomic_last_arrival", "kernels/gemm/gemv.py",
       "if arrived == SPLIT_K - 1:", "if arrived == SPLIT_K - 2:",
       "the split-K reduction is done by the next-to-last program, before the last partial is in",
       GEMM + "test_splitk_matches_reference"),
    _m("teach_splitk_partial_lost", "kernels/gemm/teach_splitk.py",
       "for s in range(S):", "for s in range(S - 1):",
       "the notebook's deterministic split-K loses the last split's partial",
       GEMM + "test_the_teaching_kernels_match_the_reference"),
    _m("gemv_norm_eps_dropped", "kernels/gemm/gemv.py",
       "rstd = tl.math.rsqrt(ss / K + eps)", "rstd = tl.math.rsqrt(ss / K)",
       "the decode GEMV's norm prologue drops eps",
       GEMM + "test_fused_norms_on_tiny_rows"),
    _m("gemv_norm_one_plus_w", "kernels/gemm/gemv.py",
       "* rstd[:, None]) * (1.0 + nw)).to(s.dtype)", "* rstd[:, None]) * nw).to(s.dtype)",
       "the decode GEMV's norm prologue multiplies by w instead of (1 + w)",
       GEMM + "test_add_rms_norm_linear_matches_reference"),
    _m("gemv_gated_norm_eps_dropped", "kernels/gemm/gemv.py",
       "tl.sum(o3 * o3, axis=2) / DV + eps)", "tl.sum(o3 * o3, axis=2) / DV)",
       "the decode GEMV's gated-norm prologue drops eps",
       GEMM + "test_fused_norms_on_tiny_rows"),
    _m("prompt_gemm_row_scale_eps_dropped", "kernels/gemm/tiled.py",
       "return tl.rsqrt(tl.sum(part, 1) / K + eps)", "return tl.rsqrt(tl.sum(part, 1) / K)",
       "the prompt GEMM's fused norm (the row scale) drops eps",
       GEMM + "test_split_norm_on_tiny_rows"),
    _m("prompt_gemm_residual_norm_one_plus_w", "kernels/gemm/tiled.py",
       "w1 = 1.0 + tl.load(nw_ptr", "w1 = tl.load(nw_ptr",
       "the residual epilogue scales by w instead of (1 + w)",
       GEMM + "test_linear_add_rms_norm_leaves_what_the_next_gemm_needs"),
    _m("prompt_gemm_row_scale_lost_on_up", "kernels/gemm/tiled.py",
       "\n            acc_u = acc_u * r\n", "\n            acc_u = acc_u\n",
       "the fused norm scales the gate's sums but not the up's",
       GEMM + "test_rms_scaled_linear_equals_the_norm_then_the_projection"),

    # ---------------------------------------------------------------- activations
    _m("silu_of_the_up_half", "kernels/activations/swiglu.py",
       "y = g * tl.sigmoid(g) * u", "y = u * tl.sigmoid(u) * g",
       "silu applied to the up half instead of the gate half",
       ACT + "test_silu_mul_matches_reference"),
    _m("swiglu_epilogue_sigmoid_of_up", "kernels/gemm/tiled.py",
       "first)\n        acc = acc * tl.sigmoid(acc) * acc_u", "first)\n        acc = acc * tl.sigmoid(acc_u) * acc_u",
       "the prompt GEMM's SwiGLU epilogue takes the sigmoid of the up sums",
       ACT + "test_linear_silu_mul_matches_reference"),
    _m("swiglu_prologue_silu_lost", "kernels/gemm/gemv.py",
       "return (gf * tl.sigmoid(gf) * u).to(g.dtype)", "return (gf * u).to(g.dtype)",
       "the decode GEMV's SwiGLU prologue forgets the sigmoid",
       ACT + "test_swiglu_down_matches_linear_of_silu_mul"),

    # ---------------------------------------------------------------- rope
    _m("rope_rotate_half_signs", "kernels/rope/rotary.py",
       "sin = tl.where(is_first, -sin, tl.where(is_rot, sin, 0.0))",
       "sin = tl.where(is_first, sin, tl.where(is_rot, -sin, 0.0))",
       "rotate-half with the signs of the two halves swapped (a rotation the other way)",
       ROPE + "test_rope_matches_reference_on_a_strided_view"),
    _m("rope_second_half_frequency", "kernels/rope/rotary.py",
       "freq_idx = tl.where(is_first, offs_d, offs_d - HALF)", "freq_idx = offs_d",
       "the second half of a pair reads its own lane's frequency, not its partner's",
       ROPE + "test_rope_matches_reference_on_a_strided_view"),
    _m("qk_norm_eps_dropped", "kernels/rope/rotary.py",
       "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)", "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D)",
       "the fused q/k norm drops eps",
       ROPE + "test_qk_norm_rope_on_tiny_and_zero_heads"),
    _m("qk_norm_one_plus_w", "kernels/rope/rotary.py",
       "x = (x * rstd[:, None] * (1.0 + w[None, :]))", "x = (x * rstd[:, None] * w[None, :])",
       "the fused q/k norm multiplies by w instead of (1 + w)",
       ROPE + "test_qk_norm_rope_matches_reference_composition"),
    _m("teach_rope_signs", "kernels/rope/teach.py",
       "sin = tl.where(is_first, -tl.sin(phi), tl.where(is_rot, tl.sin(phi), 0.0))",
       "sin = tl.where(is_first, tl.sin(phi), tl.where(is_rot, -tl.sin(phi), 0.0))",
       "the notebook's RoPE rotates the other way",
       ROPE + "test_teaching_rope_matches_reference"),

    # ---------------------------------------------------------------- attention
    _m("flash_causal_diagonal", "kernels/attention/flash.py",
       "(keys[None, :] <= pos[:, None])", "(keys[None, :] < pos[:, None])",
       "the causal mask hides the query's own key (the diagonal)",
       ATT + "test_prefill_attention_matches_reference"),
    _m("flash_denominator_not_rescaled", "kernels/attention/flash.py",
       "l_i = l_i * alpha + tl.sum(p, 1)", "l_i = l_i + tl.sum(p, 1)",
       "the online softmax's running sum is not rescaled when the max grows",
       ATT + "test_prefill_attention_matches_reference"),
    _m("prefill_gqa_head_map", "kernels/attention/prefill.py",
       "offs_h = kvh * G + rows % GP", "offs_h = kvh + rows % GP",
       "query heads mapped to the wrong KV head under GQA",
       ATT + "test_prefill_attention_matches_reference"),
    _m("decode_combine_unweighted_sum", "kernels/attention/decode.py",
       "total = tl.sum(w * l, 0)", "total = tl.sum(l, 0)",
       "the split-decode combine adds the splits' sums without their max correction",
       ATT + "test_decode_any_split_count_gives_the_same_result"),
    _m("decode_chunk_end_off_by_one", "kernels/attention/decode.py",
       "tl.zeros([ROWS], tl.int32) + (end - 1)", "tl.zeros([ROWS], tl.int32) + end",
       "a decode split also reads the first key of the next split (counted twice)",
       ATT + "test_decode_any_split_count_gives_the_same_result"),
    _m("teach_softmax_diagonal", "kernels/attention/teach.py",
       "visible = (j <= pos) & (j < L)", "visible = (j < pos) & (j < L)",
       "the notebook's masked softmax hides the diagonal",
       ATT + "test_teaching_kernels_match_reference"),

    # ---------------------------------------------------------------- conv1d
    _m("conv_step_state_mask", "kernels/conv1d/causal.py",
       "sv = tl.load(state_ptr + offs_c * stride_sc + p, mask=mask_c & (p < W - 1), other=0.0)",
       "sv = tl.load(state_ptr + offs_c * stride_sc + p, mask=mask_c & (p <= W - 1), other=0.0)",
       "the decode conv also adds a state column past the last (the next channel's first)",
       CONV + "test_decode_after_prefill_equals_a_longer_call"),
    _m("conv_prefill_silu_lost", "kernels/conv1d/causal.py",
       "        y = acc * tl.sigmoid(acc)\n        tl.store(out_seg",
       "        y = acc\n        tl.store(out_seg",
       "the prompt conv forgets its SiLU",
       CONV + "test_causal_conv1d_matches_reference"),
    _m("conv_prefill_state_shift", "kernels/conv1d/causal.py",
       "last = x_ptr + (T - (W - 1) + offs_s)", "last = x_ptr + (T - W + offs_s)",
       "the prompt conv keeps the wrong W-1 inputs as the new state (one step early)",
       CONV + "test_state_carried_across_calls_equals_one_long_call"),
    _m("teach_conv_state_mask", "kernels/conv1d/teach.py",
       "mask=mask_c & (p < W - 1), other=0.0)", "mask=mask_c & (p <= W - 1), other=0.0)",
       "the notebook's conv also adds a state column past the last",
       CONV + "test_teaching_kernel_matches_reference"),

    # ---------------------------------------------------------------- deltanet
    _m("recurrent_k_l2norm_eps_dropped", "kernels/deltanet/recurrent.py",
       "k = k * tl.rsqrt(tl.sum(k * k, 0) + eps)", "k = k * tl.rsqrt(tl.sum(k * k, 0))",
       "the recurrent kernel's l2norm of k drops eps",
       DNR + "test_l2norm_eps_on_zero_and_tiny_keys"),
    _m("recurrent_q_l2norm_eps_dropped", "kernels/deltanet/recurrent.py",
       "q = q * (tl.rsqrt(tl.sum(q * q, 0) + eps) * scale)", "q = q * (tl.rsqrt(tl.sum(q * q, 0)) * scale)",
       "the recurrent kernel's l2norm of q drops eps",
       DNR + "test_l2norm_eps_on_zero_and_tiny_keys"),
    _m("recurrent_decay_dropped", "kernels/deltanet/recurrent.py",
       "S = S * tl.exp(g)                                 # forget", "S = S                                 # forget",
       "the recurrent kernel never decays the state",
       DNR + "test_recurrent_matches_reference"),
    _m("conv_decode_k_l2norm_eps_dropped", "kernels/deltanet/recurrent.py",
       "rk = tl.rsqrt(tl.sum(k * k, 0) + eps)", "rk = tl.rsqrt(tl.sum(k * k, 0))",
       "the fused conv + decode step's l2norm of k drops eps",
       DNR + "test_conv_decode_step_l2norm_eps_on_zero_and_tiny_rows"),
    _m("conv_decode_q_l2norm_eps_dropped", "kernels/deltanet/recurrent.py",
       "rq = tl.rsqrt(tl.sum(q * q, 0) + eps) * scale", "rq = tl.rsqrt(tl.sum(q * q, 0)) * scale",
       "the fused conv + decode step's l2norm of q drops eps",
       DNR + "test_conv_decode_step_l2norm_eps_on_zero_and_tiny_rows"),
    _m("conv_decode_state_decay_dropped", "kernels/deltanet/recurrent.py",
       "S = S * d + (k * rk)", "S = S + (k * rk)",
       "the fused decode step writes the new state without decaying the old",
       DNR + "test_conv_decode_step_equals_conv_then_decode_step"),
    _m("chunk_prep_causal_diagonal", "kernels/deltanet/chunk_prep.py",
       "causal = i[:, None] >= i[None, :]", "causal = i[:, None] > i[None, :]",
       "the chunk's intra-chunk attention loses its diagonal",
       DNC + "test_chunked_matches_reference"),
    _m("chunk_scan_state_decay_dropped", "kernels/deltanet/chunk_scan.py",
       "S * tl.exp(G_last), input_precision=PREC)", "S, input_precision=PREC)",
       "the chunk scan carries the state into the next chunk without its decay",
       DNC + "test_chunked_matches_reference"),
    _m("chunk_prep_dt_bias_dropped", "kernels/deltanet/chunk_prep.py",
       "neg_A * _softplus(g + dt_bias)", "neg_A * _softplus(g)",
       "the fused gates of the chunked prep forget dt_bias",
       DNC + "test_chunked_fuses_the_gates"),
    _m("teach_recurrent_decay_dropped", "kernels/deltanet/teach_recurrent.py",
       "S = S * tl.exp(g)", "S = S",
       "the notebook's recurrent kernel never decays the state",
       DNR + "test_teaching_recurrent_matches_reference"),

    # ---------------------------------------------------------------- sampling
    _m("top_k_boundary", "kernels/sampling/radix_select.py",
       "ok = ok & (n_above + count_gt < top_k)", "ok = ok & (n_above + count_gt <= top_k)",
       "top-k keeps k + 1 tokens",
       SAMP + "test_matches_reference_exactly"),
    _m("top_p_counts_the_token_itself", "kernels/sampling/radix_select.py",
       "ok = ok & (m_above + mass_gt < total * top_p)", "ok = ok & (m_above + mass_ge < total * top_p)",
       "top-p compares the mass including the token itself (drops the token that crosses top_p)",
       SAMP + "test_matches_reference_exactly"),
    # (the tie rule itself, tie_break_left=False, is not a mutant here: Triton 3.9's interpreter breaks argmax ties
    # to the left whatever the flag says, so no CPU test can see it; on a GPU the ties test does)
    _m("greedy_block_index_not_offset", "kernels/sampling/radix_select.py",
       "tl.argmax(x, axis=0, tie_break_left=True) + pid * BLOCK", "tl.argmax(x, axis=0, tie_break_left=True)",
       "greedy stores each block's argmax as an index within the block, not within the row",
       SAMP + "test_greedy_ties_take_the_lowest_index"),
    _m("teach_top_k_boundary", "kernels/sampling/teach.py",
       "keep &= n_greater < top_k", "keep &= n_greater <= top_k",
       "the notebook's sampler keeps k + 1 tokens",
       SAMP + "test_teaching_sampler_matches_reference"),

    # ---------------------------------------------------------------- persistent decode (issue 50)
    _m("persistent_norm_item_loses_one_plus_w", "kernels/persistent/items.py",
       "(x * rstd * (1.0 + w))", "(x * rstd * w)",
       "the persistent step's norm item multiplies by w, not (1 + w)",
       PERS + "test_the_persistent_step_equals_the_plain_decode_steps"),
    _m("persistent_fused_norm_loses_one_plus_w", "kernels/persistent/items.py",
       "(x * rstd * (1.0 + nw))", "(x * rstd * nw)",
       "the GEMV tiles' fused norm multiplies by w, not (1 + w)",
       PERS + "test_the_persistent_step_equals_the_plain_decode_steps"),
    _m("persistent_state_not_decayed", "kernels/persistent/items.py",
       "tl.store(s_ptrs, S * d + (k * rk)[:, None] * delta[None, :], mask=s_ok)",
       "tl.store(s_ptrs, S + (k * rk)[:, None] * delta[None, :], mask=s_ok)",
       "the persistent DeltaNet item writes the state back without its decay",
       PERS + "test_the_persistent_step_equals_the_plain_decode_steps"),
    _m("persistent_deltanet_item_reads_head_0s_state", "kernels/persistent/items.py",
       "            s_ptrs = state_ptr + h * DK * DV + offs_k", "            s_ptrs = state_ptr + offs_k",
       "the persistent DeltaNet item updates value head 0's state for every head",
       PERS + "test_the_persistent_step_equals_the_plain_decode_steps"),
    _m("persistent_folded_prep_reads_kv_head_0", "kernels/persistent/items.py",
       "HKV * D, D, g, tl.load(pos_ptr), start, end", "HKV * D, D, 0, tl.load(pos_ptr), start, end",
       "with fold_prep every attention split prepares KV head 0's queries and key",
       PERS + "test_the_attention_prep_folded_into_the_splits_changes_no_bit"),
    _m("persistent_late_input_computed_a_pass_too_late", "kernels/persistent/items.py",
       "                if it == 0:   # (the copies", "                if it == 1:   # (the copies",
       "with gemv_late the GEMV items compute their input in the loop's second pass: the first row block sums zeros",
       PERS + "test_the_gemv_input_in_the_loops_first_pass_changes_no_bit"),
    _m("persistent_early_gemv_never_waits", "kernels/persistent/items.py",
       "seen = wait_counter(counters_ptr, wc, target, spin_limit, False, POLL_THREADS)", "seen = target",
       "with gemv_early the GEMV items skip their wait: a tile reads its input whether or not its producers are done",
       PERS + "test_a_wait_nobody_satisfies_raises_naming_the_item"),
    _m("persistent_fields_ahead_drop_each_programs_last_item", "kernels/persistent/decode.py",
       "items_ptr, order_ptr, j + 1, j + 1 < last, epoch, F)", "items_ptr, order_ptr, j + 1, j + 2 < last, epoch, F)",
       "with fields_ahead each program's last item reads no fields: it runs as an EMBED item with zeros",
       PERS + "test_item_fields_read_ahead_change_no_bit"),
    _m("persistent_gemv_ahead_sums_a_stale_block", "kernels/persistent/items.py",
       "            w = w_next   # the block summed next\n", "            pass\n",
       "the GEMV items that load ahead sum the first weight block again instead of the one just loaded",
       PERS + "test_gemv_blocks_loaded_ahead_change_no_bit"),
    _m("persistent_column_split_stores_the_sum_not_the_squares", "kernels/persistent/items.py",
       "tl.store(ss_ptr + h * DN_SPLIT + part, tl.sum(o * o, 0))",
       "tl.store(ss_ptr + h * DN_SPLIT + part, tl.sum(o, 0))",
       "a DeltaNet column split stores the sum of its o columns, not of their squares, for the gated norm",
       PERS + "test_deltanet_column_splits_change_no_bit"),
    _m("persistent_in_proj_conv_never_shifts_its_state", "kernels/persistent/items.py",
       "        _conv_shift(cs_ptr, rows, c_ok, shifted, CW, BW)\n", "",
       "the in-projection's tiles run the conv but leave its state as it was, so the next token convolves stale inputs",
       PERS + "test_deltanet_column_splits_change_no_bit"),
    _m("persistent_gated_norm_reads_one_split", "kernels/persistent/items.py",
       "for part in tl.static_range(DN_SPLIT):", "for part in tl.static_range(1):",
       "the out_proj tiles take the rms of a split head from its first column split alone",
       PERS + "test_deltanet_column_splits_change_no_bit"),
    _m("teach_second_gemv_reads_the_input", "kernels/persistent/teach.py",
       "_tile(w2_ptr, h_ptr, y_ptr,", "_tile(w2_ptr, x_ptr, y_ptr,",
       "the second GEMV item reads the launch's input instead of the first GEMV's result",
       PERS + "test_two_dependent_gemvs_in_one_launch"),
    # ---------------------------------------------------------------- model, plan, generation
    _m("plan_last_row_a_layer_early", "plan.py",
       "i == len(W.layers) - 1", "i == len(W.layers) - 2",
       "the fast route cuts to the last row one layer too early (the last layer's mixer sees one token)",
       MODEL + "test_a_step_runs_the_last_layer_past_its_mixer_for_the_last_row"),
    _m("model_logits_of_the_first_row", "model.py",
       "h if all_logits else h[-1:]", "h if all_logits else h[:1]",
       "the plain route returns the first position's logits instead of the last",
       MODEL + "test_a_step_runs_the_last_layer_past_its_mixer_for_the_last_row"),
    _m("cli_ignores_the_temperature", "generation.py",
       "max_new_tokens=args.max_new_tokens, temperature=args.temperature,",
       "max_new_tokens=args.max_new_tokens, temperature=1.0,",
       "the command line samples at temperature 1 whatever --temperature says",
       "tests/test_generate.py::test_cli_generates_on_the_tiny_default"),
    _m("decode_position_not_advanced", "generation.py",
       "    position += 1\n    return draw", "    return draw",
       "decode steps all run at the same position (the cache row overwritten)",
       MODEL + "test_greedy_generation_matches_transformers_token_for_token"),
]
