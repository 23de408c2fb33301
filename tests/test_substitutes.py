"""The stand-ins for CUDA-only libraries: when they are served, and that each computes what the
real library computes, checked against torch's reference math forward and backward."""

import json
import math
import os
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import python


# --- the import hook ------------------------------------------------------------------------
def test_an_absent_library_gets_its_stand_in_and_deactivation_takes_it_away():
    import cudashim
    cudashim.activate("cpu", report=True)
    import flash_attn
    from cudashim.activation import current_activation
    assert flash_attn.__file__.endswith("cudashim/substitutes/flash_attn/__init__.py")
    assert "not installed" in current_activation().report.stand_ins["flash_attn"]
    import importlib.metadata as metadata
    assert metadata.version("flash-attn") == flash_attn.__version__ == "2.8.3+cudashim"
    assert metadata.packages_distributions()["flash_attn"] == ["flash_attn"]
    cudashim.deactivate()
    assert "flash_attn" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        import flash_attn  # noqa: F811,F401
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("flash-attn")


@pytest.mark.parametrize("choice, served", [("none", set()), ("pynvml", {"pynvml"}),
                                             ("all", {"pynvml", "xformers"})])
def test_the_substitute_setting_chooses_the_libraries(choice, served):
    import importlib

    import cudashim
    cudashim.activate("cpu", substitute=choice)
    got = set()
    for name in ("pynvml", "xformers"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if "cudashim" in module.__file__:
            got.add(name)
    assert got == served


def test_a_bad_substitute_setting_names_the_valid_ones():
    from cudashim import _settings
    with pytest.raises(ValueError, match="flash_attn, xformers, apex, pynvml"):
        _settings.load(substitute="flash_atn")
    assert _settings.load(environ={"CUDASHIM_SUBSTITUTE": "none"}).to_environ()["CUDASHIM_SUBSTITUTE"] == "none"


def _fake_package(root, name, body):
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text(textwrap.dedent(body))


@pytest.mark.parametrize("body, kept", [
    ("raise ImportError('libcudart.so.12: cannot open shared object file')", False),
    ("def nvmlInit():\n    raise RuntimeError('NVML Shared Library Not Found')\n"
     "def nvmlShutdown(): pass\n", False),
    ("REAL = True\ndef nvmlInit(): pass\ndef nvmlShutdown(): pass\n", True),
])
def test_an_installed_package_wins_only_where_it_imports_and_works(tmp_path, monkeypatch, body, kept):
    _fake_package(tmp_path, "pynvml", body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)    # torch imports nvidia-ml-py's
    import cudashim
    cudashim.activate("cpu")
    import pynvml
    assert hasattr(pynvml, "REAL") == kept
    assert pynvml.__spec__.origin.startswith(str(tmp_path)) == kept
    assert (pynvml.nvmlInit() is None)                 # whichever it is, it works now


def test_a_missing_part_of_a_stand_in_is_an_import_error_naming_the_way_out():
    import cudashim
    from cudashim.errors import UnsupportedCudaAPI
    cudashim.activate("cpu")
    with pytest.raises(ImportError, match="scaled_dot_product_attention") as caught:
        from flash_attn.ops.triton.rotary import apply_rotary  # noqa: F401
    assert isinstance(caught.value, UnsupportedCudaAPI)
    from apex import optimizers
    assert not hasattr(optimizers, "NoSuchThing")
    with pytest.raises(ImportError, match="FusedLAMB under torch.autocast"):
        from apex.optimizers import FusedMixedPrecisionLamb  # noqa: F401


def test_transformers_accepts_the_flash_attn_stand_in(shim):
    pytest.importorskip("transformers")
    from transformers.utils import import_utils
    assert import_utils.is_flash_attn_2_available()


# --- flash_attn -----------------------------------------------------------------------------
def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, slopes=None, scale=None,
              top_left=False, bias=None):
    """Attention by its definition, in float64, over (batch, seqlen, heads, headdim)."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)
    sq, sk = q.shape[1], k.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (scale or 1 / math.sqrt(q.shape[-1]))
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(sq)[:, None] + (0 if top_left else sk - sq)
    j = torch.arange(sk)[None]
    if slopes is not None:
        scores = scores - slopes.double().view(1, -1, 1, 1) * (i - j).abs()
    if bias is not None:
        scores = scores + bias.double()
    seen = torch.ones(sq, sk, dtype=torch.bool)
    right = 0 if causal else window[1]
    if right >= 0:
        seen &= j <= i + right
    if window[0] >= 0:
        seen &= j >= i - window[0]
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def close(got, want):
    torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=1e-5)


def _qkv(sq=5, sk=7, heads=4, kv_heads=2, d=8, batch=2, requires_grad=False):
    torch.manual_seed(0)
    make = lambda s, h: torch.randn(batch, s, h, d, requires_grad=requires_grad)  # noqa: E731
    return make(sq, heads), make(sk, kv_heads), make(sk, kv_heads)


@pytest.mark.parametrize("options", [
    {}, {"causal": True}, {"window_size": (2, 1)}, {"causal": True, "window_size": (3, -1)},
    {"softcap": 2.0}, {"softmax_scale": 0.3}, {"causal": True, "alibi_slopes": torch.tensor([0.5, 0.25, 0.1, 0.05])},
])
@pytest.mark.parametrize("lengths", [(5, 7), (7, 5)])
def test_flash_attn_func_forward_and_backward_match_the_definition(shim, options, lengths):
    from flash_attn import flash_attn_func
    q, k, v = _qkv(*lengths, requires_grad=True)
    out = flash_attn_func(q, k, v, **options)
    expected = reference(q, k, v, causal=options.get("causal", False),
                         window=options.get("window_size", (-1, -1)), softcap=options.get("softcap", 0.0),
                         slopes=options.get("alibi_slopes"), scale=options.get("softmax_scale"))
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    want = torch.autograd.grad(expected.sum(), (q, k, v))
    for got, w in zip(grads, want):
        torch.testing.assert_close(got.double(), w.double(), atol=1e-5, rtol=1e-5)


def test_flash_attn_packed_variants_and_attention_probabilities(shim):
    from flash_attn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
    q, k, v = _qkv(6, 6, heads=2, kv_heads=2)
    plain = flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(flash_attn_qkvpacked_func(torch.stack((q, k, v), 2), causal=True), plain)
    torch.testing.assert_close(flash_attn_kvpacked_func(q, torch.stack((k, v), 2), causal=True), plain)
    out, lse, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    torch.testing.assert_close(out, plain, atol=1e-6, rtol=1e-5)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    torch.testing.assert_close(probs, torch.softmax(scores, -1))


def test_flash_attn_dropout_drops(shim):
    from flash_attn import flash_attn_func
    q, k, v = _qkv()
    assert not torch.allclose(flash_attn_func(q, k, v, dropout_p=0.5), flash_attn_func(q, k, v))


def test_flash_attn_varlen_equals_each_sequence_alone(shim):
    from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_varlen_qkvpacked_func
    torch.manual_seed(1)
    lengths = [3, 5, 2]
    seqs = [torch.randn(1, n, 4, 8) for n in lengths]
    packed = torch.cat([s[0] for s in seqs])
    cu = torch.tensor([0, 3, 8, 10], dtype=torch.int32)
    out = flash_attn_varlen_func(packed, packed, packed, cu, cu, 5, 5, causal=True)
    alone = torch.cat([flash_attn_func(s, s, s, causal=True)[0] for s in seqs])
    torch.testing.assert_close(out, alone)
    qkv = torch.stack((packed, packed, packed), 1)
    out, lse, _ = flash_attn_varlen_qkvpacked_func(qkv, cu, 5, causal=True, return_attn_probs=True)
    torch.testing.assert_close(out, alone)
    assert lse.shape == (4, 10)


def test_flash_attn_with_kvcache_writes_the_cache_and_attends_over_it(shim):
    from flash_attn import flash_attn_func, flash_attn_with_kvcache
    torch.manual_seed(2)
    k_all, v_all, q_all = (torch.randn(2, 6, 2, 8) for _ in range(3))
    k_cache, v_cache = torch.zeros(2, 10, 2, 8), torch.zeros(2, 10, 2, 8)
    k_cache[:, :5], v_cache[:, :5] = k_all[:, :5], v_all[:, :5]
    out = flash_attn_with_kvcache(q_all[:, 5:], k_cache, v_cache, k_all[:, 5:], v_all[:, 5:],
                                  cache_seqlens=torch.tensor([5, 5], dtype=torch.int32), causal=True)
    torch.testing.assert_close(k_cache[:, :6], k_all)
    torch.testing.assert_close(out, flash_attn_func(q_all, k_all, v_all, causal=True)[:, 5:])
    # the same through a paged cache of blocks of 4, blocks listed out of order
    paged_k, paged_v = torch.zeros(6, 4, 2, 8), torch.zeros(6, 4, 2, 8)
    table = torch.tensor([[3, 0], [5, 1]], dtype=torch.int32)
    for b in range(2):
        for pos in range(5):
            paged_k[table[b, pos // 4], pos % 4] = k_all[b, pos]
            paged_v[table[b, pos // 4], pos % 4] = v_all[b, pos]
    paged = flash_attn_with_kvcache(q_all[:, 5:], paged_k, paged_v, k_all[:, 5:], v_all[:, 5:],
                                    cache_seqlens=torch.tensor([5, 5], dtype=torch.int32),
                                    block_table=table, causal=True)
    torch.testing.assert_close(paged, out)


def test_which_query_rows_see_no_key_is_known_from_the_sizes_alone():
    """Attention's stand-ins zero a query row that sees no key; whether there is one is decided
    from the sizes, causal flag and window, no value read on the host, and agrees with the mask
    for every small case, bottom-right and top-left aligned."""
    import itertools
    from cudashim.substitutes._attention import sees_no_key_somewhere, visibility
    for seqlen_q, seqlen_k, causal, left, right, top_left in itertools.product(
            range(5), range(5), (False, True), range(-1, 3), range(-1, 3), (False, True)):
        seen = visibility(seqlen_q, seqlen_k, causal, (left, right), "cpu", top_left)
        expected = seen is not None and bool((~seen.any(-1)).any())
        assert sees_no_key_somewhere(seqlen_q, seqlen_k, causal, (left, right), top_left) == expected


def test_the_attention_and_normalization_stand_ins_replay_in_a_cuda_graph(shim):
    """flash_attn_func (causal, a local window that leaves rows without keys), xformers'
    attention with a causal mask, and apex's fused norms, captured in a CUDA graph: a replay on
    new inputs computes what eager calls compute, and the capture reads no value on the host."""
    import xformers.ops as xops
    from apex.normalization import FusedLayerNorm, FusedRMSNorm
    from flash_attn import flash_attn_func
    q, k, v = (t.cuda() for t in _qkv(5, 3, heads=2, kv_heads=2))
    norms = FusedLayerNorm(8).cuda(), FusedRMSNorm(8).cuda()

    def step():
        return [flash_attn_func(q, k, v, causal=True), flash_attn_func(q, k, v, window_size=(0, 0)),
                xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask()),
                *(norm(q) for norm in norms)]
    with torch.no_grad():
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        for tensor in (q, k, v):
            tensor.copy_(torch.randn_like(tensor))
        graph.replay()
        for ours, eager in zip(captured, step()):
            close(ours, eager)


class _LargestResult(TorchDispatchMode):
    """The most elements any op's result had while it was entered."""
    elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(result):
            if isinstance(tensor, torch.Tensor):
                self.elements = max(self.elements, tensor.numel())
        return result


@pytest.mark.parametrize("layout", ["contiguous", "paged, rotary, alibi, log-sum-exp"])
def test_a_decoding_step_captured_in_a_cuda_graph_replays_with_the_cache_lengths_moved_on(shim, layout):
    """flash_attn_with_kvcache in a decoding step captured once (flash_attn's own generation with
    ``cg=True``): the program moves ``cache_seqlens`` on in place between replays, and each replay
    writes the new keys at the new lengths and attends as an eager call on the same cache does,
    over the keys each sequence has: no op of a replay makes more than the eager call's ops, where
    attending over the whole cache would. The capture reads no length on the host."""
    from flash_attn import flash_attn_with_kvcache
    torch.manual_seed(5)
    paged = layout != "contiguous"
    options = {"causal": True}
    if paged:
        k_cache, v_cache = torch.randn(6, 4, 2, 8), torch.randn(6, 4, 2, 8)
        angles = torch.outer(torch.arange(16.0), 1.0 / 10000 ** (torch.arange(0, 4, 2) / 4))
        options.update(block_table=torch.tensor([[3, 0], [5, 1]], dtype=torch.int32).cuda(),
                       rotary_cos=angles.cos().cuda(), rotary_sin=angles.sin().cuda(),
                       alibi_slopes=torch.tensor([0.5, 0.25, 0.1, 0.05]).cuda(), return_softmax_lse=True)
    else:
        k_cache, v_cache = torch.randn(2, 64, 2, 8), torch.randn(2, 64, 2, 8)
    k_cache, v_cache = k_cache.cuda(), v_cache.cuda()
    q, k, v = torch.randn(2, 1, 4, 8).cuda(), torch.randn(2, 1, 2, 8).cuda(), torch.randn(2, 1, 2, 8).cuda()
    lengths = torch.tensor([2, 4], dtype=torch.int32).cuda()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        with torch.cuda.graph(graph):
            out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, **options)
        for _ in range(3):
            for tensor in (q, k, v):
                tensor.copy_(torch.randn_like(tensor))
            lengths.add_(1)
            caches = k_cache.clone(), v_cache.clone()
            with _LargestResult() as eager_ops:
                eager = flash_attn_with_kvcache(q, *caches, k, v, cache_seqlens=lengths, **options)
            with _LargestResult() as replayed_ops:
                graph.replay()
            for ours, theirs in zip(*((result,) if not paged else result for result in (out, eager))):
                close(ours, theirs)
            assert torch.equal(k_cache, caches[0]) and torch.equal(v_cache, caches[1])
            assert replayed_ops.elements <= eager_ops.elements, (replayed_ops.elements, eager_ops.elements)


def test_a_paged_cache_is_read_only_as_far_as_each_sequence_has_grown(shim):
    """An engine's block table lists every block a sequence may grow into: a call gathers the
    blocks its keys fill, not the table's whole width, and attends as over a table listing only
    those (decoding with the cache, and variable-length prefill over it)."""
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
    torch.manual_seed(8)
    k_cache, v_cache = torch.randn(64, 16, 2, 8).cuda(), torch.randn(64, 16, 2, 8).cuda()
    table = torch.randperm(64, dtype=torch.int32).view(2, 32).cuda()       # 512 positions a sequence
    q = torch.randn(2, 1, 4, 8).cuda()
    lengths = torch.tensor([5, 20], dtype=torch.int32).cuda()
    with _LargestResult() as ops:
        out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table)
    close(out, flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table[:, :2]))
    assert ops.elements <= 2 * 16 * 2 * 8, ops.elements           # two blocks of keys at most
    bounds, q_packed = torch.tensor([0, 5, 25], dtype=torch.int32).cuda(), torch.randn(25, 4, 8).cuda()
    with _LargestResult() as ops:
        out = flash_attn_varlen_func(q_packed, k_cache, v_cache, bounds, bounds, 20, 20, causal=True,
                                     block_table=table)
    close(out, flash_attn_varlen_func(q_packed, k_cache, v_cache, bounds, bounds, 20, 20, causal=True,
                                      block_table=table[:, :2]))
    assert ops.elements <= max(2 * 16 * 2 * 8, out.numel()), ops.elements     # or the output


def test_a_variable_length_call_captured_in_a_cuda_graph_replays_with_each_replays_boundaries(shim):
    """flash_attn_varlen_func in a captured step (an engine's decoding over a batch of sequences
    packed end to end): each replay attends within the boundaries the program wrote into
    ``cu_seqlens`` before it, as an eager call does; the capture reads none of them on the host."""
    from flash_attn import flash_attn_varlen_func
    torch.manual_seed(7)
    q, k, v = torch.randn(10, 4, 8).cuda(), torch.randn(10, 2, 8).cuda(), torch.randn(10, 2, 8).cuda()
    bounds = torch.tensor([0, 3, 10], dtype=torch.int32).cuda()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        with torch.cuda.graph(graph):
            out = flash_attn_varlen_func(q, k, v, bounds, bounds, 10, 10, causal=True)
        for given in ([0, 6, 10], [0, 1, 10], [0, 3, 10]):
            bounds.copy_(torch.tensor(given, dtype=torch.int32))
            q.copy_(torch.randn_like(q))
            graph.replay()
            close(out, flash_attn_varlen_func(q, k, v, bounds, bounds, 10, 10, causal=True))


def test_flash_attn_rotary_matches_the_definition(shim):
    from flash_attn.layers.rotary import apply_rotary_emb
    torch.manual_seed(3)
    x = torch.randn(1, 4, 2, 8)
    angles = torch.outer(torch.arange(4.0), 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8))
    cos, sin = angles.cos(), angles.sin()
    half = torch.cat((x[..., 4:] * -1, x[..., :4]), -1)          # GPT-NeoX: rotate halves
    expected = x * torch.cat((cos, cos), -1)[None, :, None] + half * torch.cat((sin, sin), -1)[None, :, None]
    torch.testing.assert_close(apply_rotary_emb(x, cos, sin), expected)
    pairs = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)   # GPT-J: rotate pairs
    wide = lambda t: t.repeat_interleave(2, -1)[None, :, None]  # noqa: E731
    torch.testing.assert_close(apply_rotary_emb(x, cos, sin, interleaved=True),
                               x * wide(cos) + pairs * wide(sin))


def test_bert_padding_round_trip(shim):
    from flash_attn.bert_padding import pad_input, unpad_input
    hidden = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    tokens, indices, cu, longest, used = unpad_input(hidden, mask)
    assert tokens.shape == (5, 3) and cu.tolist() == [0, 3, 5] and longest == 3 and used.tolist() == [3, 2]
    back = pad_input(tokens, indices, 2, 4)
    torch.testing.assert_close(back, hidden * mask[..., None])


# --- xformers ---------------------------------------------------------------------------------
def test_xformers_biases_match_the_definition(shim):
    import xformers.ops as xops
    from xformers.ops import fmha
    q, k, v = _qkv(5, 7, heads=2, kv_heads=2, batch=1)
    cases = [
        (None, {}),
        (xops.LowerTriangularMask(), {"causal": True, "top_left": True}),
        (fmha.attn_bias.LowerTriangularFromBottomRightMask(), {"causal": True}),
        (fmha.attn_bias.LowerTriangularFromBottomRightMask().make_local_attention(3),
         {"causal": True, "window": (2, -1)}),
    ]
    for bias, definition in cases:
        close(xops.memory_efficient_attention(q, k, v, attn_bias=bias), reference(q, k, v, **definition))
    tensor = torch.randn(1, 2, 5, 7)
    close(xops.memory_efficient_attention(q, k, v, attn_bias=tensor), reference(q, k, v, bias=tensor))
    causal_plus = xops.LowerTriangularMask().add_bias(tensor)
    close(xops.memory_efficient_attention(q, k, v, attn_bias=causal_plus),
          reference(q, k, v, causal=True, top_left=True, bias=tensor))


def test_xformers_block_diagonal_masks_attend_within_each_sequence(shim):
    import xformers.ops as xops
    from xformers.ops import fmha
    torch.manual_seed(4)
    seqs = [torch.randn(1, n, 2, 8) for n in (3, 4)]
    bias, packed = fmha.BlockDiagonalMask.from_tensor_list(seqs)
    for mask, causal in ((bias, False), (bias.make_causal(), True)):
        out = xops.memory_efficient_attention(packed, packed, packed, attn_bias=mask)
        for got, seq in zip(mask.split(out), seqs):
            close(got, reference(seq, seq, seq, causal=causal, top_left=True))
        dense = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (packed,) * 3),
                                               attn_mask=mask.materialize((7, 7)))
        close(out, dense.transpose(1, 2))


def test_xformers_three_and_five_dimensional_inputs(shim):
    import xformers.ops as xops
    q3 = torch.randn(2, 5, 8)
    flash_op = xops.MemoryEfficientAttentionFlashAttentionOp
    close(xops.memory_efficient_attention(q3, q3, q3, op=flash_op),
          reference(q3[:, :, None], q3[:, :, None], q3[:, :, None])[:, :, 0])
    q5 = torch.randn(1, 5, 2, 3, 8)
    kv = torch.randn(1, 5, 2, 1, 8).expand(1, 5, 2, 3, 8)
    out = xops.memory_efficient_attention(q5, kv, kv)
    assert out.shape == q5.shape
    close(out.flatten(2, 3), reference(q5.flatten(2, 3), kv.flatten(2, 3), kv.flatten(2, 3)))


# --- apex ---------------------------------------------------------------------------------
def test_a_bare_import_apex_reaches_its_parts_as_attributes(shim):
    """Real apex imports its parts at its own import; DeepSpeed's fp16 optimizer reads
    ``apex.optimizers.FusedAdam`` after a bare ``import apex``."""
    import apex
    assert apex.optimizers.FusedAdam.__module__.startswith("apex.optimizers")
    assert apex.normalization.FusedLayerNorm is not None
    assert callable(apex.amp.initialize)
    assert apex.parallel.DistributedDataParallel is not None


def _train(optimizer_class, steps=5, **options):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    optimizer = optimizer_class(model.parameters(), **options)
    for _ in range(steps):
        model(torch.randn(4, 6)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("apex_name, options, torch_class, torch_options", [
    ("FusedAdam", {"lr": 1e-2, "weight_decay": 0.1}, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    ("FusedAdam", {"lr": 1e-2, "weight_decay": 0.1, "adam_w_mode": False}, torch.optim.Adam,
     {"lr": 1e-2, "weight_decay": 0.1}),
    ("FusedSGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}, torch.optim.SGD,
     {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ("FusedAdagrad", {"lr": 0.1, "weight_decay": 0.01}, torch.optim.Adagrad, {"lr": 0.1, "weight_decay": 0.01}),
])
def test_apex_optimizers_step_as_torch_optim(shim, apex_name, options, torch_class, torch_options):
    from apex import optimizers
    for got, want in zip(_train(getattr(optimizers, apex_name), **options), _train(torch_class, **torch_options)):
        torch.testing.assert_close(got, want)


def _lamb_reference(lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=1.0, steps=5):
    """LAMB by its definition, written out in float64 for one model."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    params = list(model.parameters())
    m = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    v = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    for t in range(1, steps + 1):
        model(torch.randn(4, 6)).pow(2).mean().backward()
        norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params))
        clip = max(norm / max_grad_norm, 1.0)
        with torch.no_grad():
            for i, p in enumerate(params):
                g = p.grad.double() / clip
                m[i] = betas[0] * m[i] + (1 - betas[0]) * g
                v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
                update = (m[i] / (1 - betas[0] ** t)) / ((v[i] / (1 - betas[1] ** t)).sqrt() + eps)
                update = update + weight_decay * p.double()
                w, u = p.double().norm(), update.norm()
                ratio = w / u if w > 0 and u > 0 else 1.0
                p.copy_(p.double() - lr * ratio * update)
                p.grad = None
    return [p.detach() for p in params]


def test_apex_lamb_is_lamb(shim):
    from apex.optimizers import FusedLAMB
    for got, want in zip(_train(FusedLAMB, lr=1e-2), _lamb_reference()):
        torch.testing.assert_close(got, want.float(), atol=1e-6, rtol=1e-5)


def test_apex_novograd_normalizes_each_tensor_by_its_gradient_norm(shim):
    from apex.optimizers import FusedNovoGrad
    torch.manual_seed(6)
    w = torch.nn.Parameter(torch.randn(8))
    optimizer = FusedNovoGrad([w], lr=0.5)
    start = w.detach().clone()
    (w - 3).pow(2).sum().backward()
    grad = w.grad.clone()
    optimizer.step()
    # first step, bias-corrected: the moment is the gradient over its own norm
    torch.testing.assert_close(w.detach(), start - 0.5 * grad / (grad.norm() + 1e-8))
    assert optimizer.state[w]["exp_avg_sq"].dim() == 0
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = (w - 3).pow(2).sum()
        losses.append(float(loss))
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0] / 4


def test_apex_normalization_is_torchs(shim):
    from apex.normalization import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm
    x = torch.randn(3, 8)
    torch.testing.assert_close(FusedLayerNorm(8)(x), torch.nn.LayerNorm(8)(x))
    torch.testing.assert_close(FusedRMSNorm(8, eps=1e-5)(x), torch.nn.RMSNorm(8, eps=1e-5)(x))
    mixed = MixedFusedLayerNorm(8)
    half = x.to(torch.bfloat16)
    out = mixed(half)
    assert out.dtype == torch.bfloat16 and mixed.weight.dtype == torch.float32
    torch.testing.assert_close(out.float(), torch.nn.LayerNorm(8)(half.float()), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("name, args, settings, reference", [
    ("FusedLayerNormAffineFunction", (8, 8), ((8,), 1e-5),
     lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5)),
    ("FusedLayerNormAffineMixedDtypesFunction", (8, 8), ((8,), 1e-5),
     lambda x, w, b: F.layer_norm(x.float(), (8,), w.float(), b.float(), 1e-5).to(x.dtype)),
    ("FusedLayerNormFunction", (), ((8,), 1e-5), lambda x: F.layer_norm(x, (8,), None, None, 1e-5)),
    ("FusedRMSNormAffineFunction", (8,), (8, 1e-6), lambda x, w: F.rms_norm(x, (8,), w, 1e-6)),
    ("FusedRMSNormAffineMixedDtypesFunction", (8,), (8, 1e-6),
     lambda x, w: F.rms_norm(x.float(), (8,), w.float(), 1e-6).to(x.dtype)),
    ("FusedRMSNormFunction", (), (8, 1e-6), lambda x: F.rms_norm(x, (8,), None, 1e-6)),
])
def test_apex_normalization_functions_are_autograd_functions(shim, name, args, settings, reference):
    """Megatron calls them as ``.apply`` and reads ``forward``'s arguments."""
    import inspect
    from apex.normalization import fused_layer_norm
    function = getattr(fused_layer_norm, name)
    assert issubclass(function, torch.autograd.Function)
    assert "memory_efficient" in inspect.getfullargspec(function.forward).args
    x = torch.randn(3, 8, requires_grad=True)
    weights = [torch.randn(n, requires_grad=True) for n in args]
    out = function.apply(x, *weights, *settings, False)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, *weights], grad, retain_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(grads, torch.autograd.grad(out, [x, *weights], grad)))
    expected = reference(x, *weights)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, torch.autograd.grad(expected, [x, *weights], grad)):
        torch.testing.assert_close(got, want)
    frozen = function.apply(x.detach(), *[w.detach() for w in weights], *settings)
    assert not frozen.requires_grad and frozen._base is None      # Megatron frees outputs' storage


@pytest.mark.host                   # O1's linear computes in float16 where the CPU does, as on CUDA
def test_apex_amp_scales_the_loss_and_skips_a_step_that_overflowed(shim):
    from apex import amp
    from apex.optimizers import FusedAdam
    model = torch.nn.Linear(4, 1).cuda()
    optimizer = FusedAdam(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    before = model.weight.detach().clone()
    loss = model(torch.randn(2, 4, device="cuda")).float().sum() * float("inf")
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    assert torch.equal(model.weight, before), "a step with inf gradients must be skipped"
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 2 ** 15
    optimizer.zero_grad()
    # One row of inputs under 1: the bias's and the weight's float16 gradients at 2 ** 15 stay
    # under float16's 65504, as they must for a step to be taken where O1's linear computes in
    # float16, as on CUDA (two rows would sum the bias's to 65536: inf, and the step skipped).
    loss = model(torch.rand(1, 4, device="cuda")).float().sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        assert float(scaled) == float(loss) * 2 ** 15           # the loss goes in scaled
        scaled.backward()
    grad = model.weight.grad.clone()
    optimizer.step()
    assert not torch.equal(model.weight, before)
    assert grad.abs().max() < 100, "gradients are unscaled before the step"


def test_amp_C_through_multi_tensor_applier(shim):
    import amp_C
    from apex.multi_tensor_apply import multi_tensor_applier
    tensors = [torch.randn(5), torch.randn(3, 2)]
    flag = torch.zeros(1, dtype=torch.int)
    total, each = multi_tensor_applier(amp_C.multi_tensor_l2norm, flag, [tensors], True)
    torch.testing.assert_close(total[0], torch.cat([t.flatten() for t in tensors]).norm())
    torch.testing.assert_close(each, torch.stack([t.norm() for t in tensors]))
    out = [torch.empty_like(t) for t in tensors]
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [tensors, out], 0.5)
    torch.testing.assert_close(out[1], tensors[1] * 0.5)
    assert flag.item() == 0
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [[torch.tensor([float("nan")])], [torch.zeros(1)]], 1.0)
    assert flag.item() == 1
    with pytest.raises(ImportError, match="fused=True"):
        amp_C.multi_tensor_adam


# --- pynvml ---------------------------------------------------------------------------------
def _real_pynvml():
    """nvidia-ml-py, as torch imported it (skips where it is not installed)."""
    real = sys.modules.get("pynvml") or pytest.importorskip("pynvml")
    if "cudashim" in real.__file__:
        pytest.skip("the real pynvml is not installed")
    return real


def test_pynvml_answers_for_the_target(shim):
    import pynvml
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == torch.cuda.device_count()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetName(handle) == torch.cuda.get_device_name(0)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    free, total = torch.cuda.mem_get_info()
    assert memory.total == total and memory.used + memory.free == memory.total
    assert abs(memory.free - free) < 2 ** 28
    assert 0 <= pynvml.nvmlDeviceGetUtilizationRates(handle).gpu <= 100
    for uuid in (pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetUUID(handle).encode()):
        assert pynvml.nvmlDeviceGetHandleByUUID(uuid) == handle
    bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
    assert pynvml.nvmlDeviceGetHandleByPciBusId(bus_id) == handle
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)] == [os.getpid()]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported) as caught:
        pynvml.nvmlDeviceGetTotalEccErrors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                           pynvml.NVML_VOLATILE_ECC)
    assert caught.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED and str(caught.value) == "Not Supported"
    import pickle
    copied = pickle.loads(pickle.dumps(caught.value))         # errors cross process boundaries
    assert type(copied) is pynvml.NVMLError_NotSupported and copied == caught.value
    assert type(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)) is pynvml.NVMLError_NotFound
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(5)
    pynvml.nvmlShutdown()


def test_pynvml_versions_describe_the_cuda_build_the_program_hears():
    import cudashim
    cudashim.activate("cpu", cuda_version="11.8")
    import pynvml
    pynvml.nvmlInit()
    assert torch.version.cuda == "11.8"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 11080
    driver = pynvml.nvmlSystemGetDriverVersion()
    assert int(driver.split(".")[0]) >= 520                # CUDA 11.8 needs driver 520 or later
    assert pynvml.nvmlSystemGetNVMLVersion() == "11." + driver


def test_pynvml_cpu_affinity_is_the_cpus_this_process_may_use_and_pins_there():
    import cudashim
    allowed = os.sched_getaffinity(0)
    cudashim.activate("cpu", device_count=2)
    import pynvml
    pynvml.nvmlInit()
    words = math.ceil(os.cpu_count() / 64)
    for index in range(2):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        mask = pynvml.nvmlDeviceGetCpuAffinity(handle, words)
        cpus = {cpu for cpu in range(64 * words) if mask[cpu // 64] >> (cpu % 64) & 1}
        assert cpus and cpus <= allowed
        scoped = pynvml.nvmlDeviceGetCpuAffinityWithinScope(handle, words, pynvml.NVML_AFFINITY_SCOPE_NODE)
        assert list(scoped) == list(mask)
        node = pynvml.nvmlDeviceGetNumaNodeId(handle)
        assert pynvml.nvmlDeviceGetMemoryAffinity(handle, 1, pynvml.NVML_AFFINITY_SCOPE_NODE)[0] == 1 << node
        pynvml.nvmlDeviceSetCpuAffinity(handle)
        assert os.sched_getaffinity(0) == cpus
        pynvml.nvmlDeviceClearCpuAffinity(handle)
        assert os.sched_getaffinity(0) == allowed


def test_pynvml_classifies_every_function_of_the_real_package():
    """Every NVML function nvidia-ml-py has is either answered by the stand-in, with the real
    one's parameters, or raises NVML's NotSupported, never a cudashim error."""
    import inspect

    import cudashim
    real = _real_pynvml()
    cudashim.activate("cpu")
    import pynvml as stand_in
    assert "cudashim" in stand_in.__file__
    stand_in.nvmlInit()
    handle = stand_in.nvmlDeviceGetHandleByIndex(0)
    functions = [n for n, f in vars(real).items() if n.startswith("nvml") and inspect.isfunction(f)]
    assert len(functions) > 300
    answered, not_supported = [], []
    for name in functions:
        ours = getattr(stand_in, name)
        if name in vars(stand_in) and name not in stand_in.NOT_SUPPORTED:
            theirs = [p for p in inspect.signature(getattr(real, name)).parameters]
            mine = [p for p in inspect.signature(ours).parameters]
            assert mine == theirs, name
            answered.append(name)
            continue
        args = [handle] * len(inspect.signature(getattr(real, name)).parameters)
        with pytest.raises(stand_in.NVMLError_NotSupported):
            ours(*args)
        not_supported.append(name)
    must_answer = {"nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID",
                   "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
                   "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetCpuAffinity",
                   "nvmlDeviceGetCpuAffinityWithinScope", "nvmlDeviceSetCpuAffinity",
                   "nvmlDeviceClearCpuAffinity", "nvmlDeviceGetNumaNodeId",
                   "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetClockInfo",
                   "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature",
                   "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion"}
    assert must_answer <= set(answered)
    assert {"nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors"} <= set(not_supported)
    for constant in [n for n in vars(stand_in) if n.startswith("NVML_")]:
        assert getattr(real, constant) == getattr(stand_in, constant), constant


def test_a_real_pynvml_imported_by_torch_is_replaced_everywhere_and_put_back():
    import types

    real = _real_pynvml()
    real_torch_cuda = sys.modules["torch.cuda"]
    assert real_torch_cuda.pynvml is real                     # torch imported it itself
    program = types.ModuleType("program_before_activation")
    exec("from pynvml import nvmlInit, NVMLError\nimport pynvml as nvml", vars(program))
    sys.modules[program.__name__] = program
    import cudashim
    cudashim.activate("cpu", report=True)
    from cudashim.activation import current_activation
    import pynvml
    assert "cudashim" in pynvml.__file__ and sys.modules["pynvml"] is pynvml
    assert real_torch_cuda.pynvml is pynvml and torch.cuda.pynvml is pynvml
    assert program.nvml is pynvml and program.nvmlInit is pynvml.nvmlInit
    assert program.NVMLError is pynvml.NVMLError
    program.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == torch.cuda.device_count()
    assert "imported before activation" in current_activation().report.stand_ins["pynvml"]
    cudashim.deactivate()
    assert sys.modules["pynvml"] is real and real_torch_cuda.pynvml is real
    assert program.nvml is real and program.nvmlInit is real.nvmlInit


@pytest.mark.parametrize("route", ["launcher", "auto", "image"])
def test_nvidia_affinity_code_runs_with_the_real_pynvml_installed(route):
    """NVIDIA's pinning code with nvidia-ml-py installed, imported by torch before cudashim
    activates, on each way of starting cudashim."""
    _real_pynvml()
    program = "tests/programs/nvml_affinity.py"
    env = None
    if route == "launcher":
        args = ("-m", "cudashim", "--device-count", "2", program)
    elif route == "auto":
        args = ("-c", f"import cudashim.auto, runpy; runpy.run_path({program!r}, run_name='__main__')")
        env = {"CUDASHIM_DEVICE_COUNT": "2"}
    else:
        from test_images import image_environment
        env, args = image_environment("--device-count", "2"), (program,)
    run = python(*args, env={**(env or {}), "LOCAL_RANK": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["stand_in"] and answer["torch_cuda_holds_it"] and answer["devices"] == 2
    assert answer["cpus"] and answer["pinned"] == answer["cpus"]
    assert answer["cuda_driver"] == 12080 and answer["driver"].startswith("570.")
    if route == "launcher":
        unshimmed = python(program)
        assert unshimmed.returncode != 0 and "NVMLError_LibraryNotFound" in unshimmed.stderr


# --- whole programs -------------------------------------------------------------------------
def test_transformers_flash_attention_2_generates_what_sdpa_generates(tmp_path):
    pytest.importorskip("transformers")
    run = python("-m", "cudashim", "--report", "tests/programs/hf_generate.py", str(tmp_path / "model"),
                 timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "flash_attention_2 flash_attention_2" in run.stdout
    tokens = json.loads(run.stdout.strip().splitlines()[-1])
    assert tokens["sdpa"] == tokens["flash_attention_2"] and len(tokens["sdpa"]) == 18
    assert "flash_attn: the real package is not installed" in run.stderr


def test_the_cuda_libraries_example_equals_its_hand_port(tmp_path):
    shimmed = python("-m", "cudashim", "examples/cuda_libraries.py", "--losses", str(tmp_path / "a.json"))
    assert shimmed.returncode == 0, shimmed.stderr
    assert "GPU memory used" in shimmed.stdout
    ported = python("tests/ported/cuda_libraries_ported.py", "--losses", str(tmp_path / "b.json"))
    assert ported.returncode == 0, ported.stderr
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert len(a) == 40 and a[-1] < a[0] / 2
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4


def test_without_the_shim_the_example_cannot_import_its_libraries():
    plain = python("examples/cuda_libraries.py", "--steps", "1")
    assert plain.returncode != 0 and "ModuleNotFoundError" in plain.stderr


@pytest.mark.parametrize("bits, stored", [(4, "torch.uint8")])
def test_qlora_with_bitsandbytes_trains_and_generates_on_the_target(tmp_path, bits, stored):
    """transformers loads the model quantized through bitsandbytes (which calls torch's private
    _parse_to with the device), PEFT trains LoRA adapters on it, and it generates. 4-bit (nf4)
    here; the 8-bit run is test_device_targets' on the CPU backend, beside the test accelerator's."""
    for package in ("bitsandbytes", "peft", "transformers"):
        pytest.importorskip(package)
    run = python("-m", "cudashim", "tests/programs/qlora.py", str(tmp_path / "model"), "--bits", str(bits),
                 "--steps", "4", "--new-tokens", "4", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["weight_dtype"] == stored and result["is_cuda"] and result["adapters_moved"]
    assert result["device"] == str(torch.zeros(1).device)         # the CPU backend's device
    losses = result["losses"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert len(result["tokens"]) == 8


def test_bitsandbytes_runs_its_cpu_backend_under_the_shim(shim):
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(7)
    model = torch.nn.Linear(128, 64).cuda()                 # 8192 weights: 8-bit optimizer state
    optimizer = bnb.optim.Adam8bit(model.parameters(), lr=1e-2)
    x = torch.randn(16, 128, device="cuda")
    first = None
    for _ in range(10):
        loss = model(x).pow(2).mean()
        first = first if first is not None else float(loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert optimizer.state[model.weight]["state1"].dtype == torch.uint8
    assert float(loss) < first
    quantized = bnb.nn.Linear8bitLt(128, 32, has_fp16_weights=False).cuda()
    assert quantized.weight.dtype == torch.int8
    assert quantized(x.half()).shape == (16, 32)
