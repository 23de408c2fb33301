"""xformers.ops.fmha.attn_bias: the attention biases programs pass, each knowing how to attend.

xformers' masks are top-left aligned (``LowerTriangularMask``: query i sees keys 0..i) unless
their name says ``FromBottomRight``. Block-diagonal masks describe several sequences packed
into one batch row; they are attended one block at a time, so no (total, total) mask is
ever built.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Tuple

import torch

from cudashim.substitutes._attention import attention, visibility

_FULL = (-1, -1)


class AttentionBias:
    """The base of every bias class: ``materialize`` gives the additive (…, Mq, Mk) tensor."""

    causal = False
    top_left = True
    window = _FULL

    def _attend(self, q, k, v, scale, p):
        return attention(q, k, v, scale=scale, causal=self.causal, window=self.window,
                         bias=self._tensor(), dropout_p=p, top_left=self.top_left)

    def _tensor(self) -> Optional[torch.Tensor]:
        return None

    def materialize(self, shape: Tuple[int, ...], dtype=torch.float32, device="cpu") -> torch.Tensor:
        seqlen_q, seqlen_k = shape[-2], shape[-1]
        q = torch.zeros(1, seqlen_q, 1, 1, device=device)
        k = torch.zeros(1, seqlen_k, 1, 1, device=device)
        return self._additive(q, k, dtype).expand(shape)

    def _additive(self, q, k, dtype):
        seen = visibility(q.shape[1], k.shape[1], self.causal, self.window, q.device, self.top_left)
        bias = torch.zeros(q.shape[1], k.shape[1], dtype=dtype, device=q.device)
        if seen is not None:
            bias = bias.masked_fill(~seen, float("-inf"))
        extra = self._tensor()
        return bias if extra is None else bias + extra.to(dtype)


class LowerTriangularMask(AttentionBias):
    """Causal: query i sees keys 0..i."""

    causal = True

    def add_bias(self, bias: torch.Tensor) -> "LowerTriangularMaskWithTensorBias":
        return LowerTriangularMaskWithTensorBias(bias)


class LowerTriangularMaskWithTensorBias(LowerTriangularMask):
    """Causal, plus a tensor added to the scores."""

    def __init__(self, bias: torch.Tensor):
        self._bias = bias

    def _tensor(self):
        return self._bias


class LowerTriangularFromBottomRightMask(AttentionBias):
    """Causal with the last query seeing every key."""

    causal = True
    top_left = False

    def make_local_attention(self, window_size: int) -> "LowerTriangularFromBottomRightLocalAttentionMask":
        return LowerTriangularFromBottomRightLocalAttentionMask(window_size)


class LowerTriangularFromBottomRightLocalAttentionMask(LowerTriangularFromBottomRightMask):
    """Bottom-right causal, each query seeing the ``window_size`` keys up to its own."""

    def __init__(self, window_size: int):
        self._window_size = window_size
        self.window = (window_size - 1, 0)


# --- several sequences packed in one batch row -----------------------------------------------
class _SeqLenInfo:
    """Where each packed sequence starts (``seqstart_py``), as xformers describes it."""

    def __init__(self, seqstart_py: List[int]):
        self.seqstart_py = seqstart_py
        self.seqstart = torch.tensor(seqstart_py, dtype=torch.int32)
        lengths = [b - a for a, b in self.intervals()]
        self.max_seqlen = max(lengths, default=0)
        self.min_seqlen = min(lengths, default=0)

    @classmethod
    def from_seqlens(cls, seqlens: Iterable[int]) -> "_SeqLenInfo":
        starts = [0]
        for length in seqlens:
            starts.append(starts[-1] + int(length))
        return cls(starts)

    def intervals(self) -> Iterable[Tuple[int, int]]:
        return zip(self.seqstart_py, self.seqstart_py[1:])

    def split(self, x: torch.Tensor, batch_sizes: Optional[Sequence[int]] = None) -> List[torch.Tensor]:
        if x.shape[0] != 1:
            raise ValueError(f"packed sequences need a batch of 1, got {x.shape[0]}")
        return [x[:, start:end] for start, end in self.intervals()]


class BlockDiagonalMask(AttentionBias):
    """Packed sequences: the queries of block i see only the keys of block i."""

    causal = False

    def __init__(self, q_seqinfo: _SeqLenInfo, k_seqinfo: _SeqLenInfo, _batch_sizes=None):
        self.q_seqinfo, self.k_seqinfo = q_seqinfo, k_seqinfo
        self._batch_sizes = _batch_sizes

    @classmethod
    def from_seqlens(cls, q_seqlen: Sequence[int], kv_seqlen: Optional[Sequence[int]] = None):
        q_info = _SeqLenInfo.from_seqlens(q_seqlen)
        k_info = q_info if kv_seqlen is None else _SeqLenInfo.from_seqlens(kv_seqlen)
        if len(q_info.seqstart_py) != len(k_info.seqstart_py):
            raise ValueError("as many query sequences as key sequences are needed")
        return cls(q_info, k_info)

    @classmethod
    def from_tensor_list(cls, tensors: Sequence[torch.Tensor]):
        """(the bias, the tensors (batch, seqlen, ...) packed into one (1, total, ...))."""
        batch_sizes = [t.shape[0] for t in tensors]
        seqlens = [t.shape[1] for t in tensors for _ in range(t.shape[0])]
        bias = cls(_SeqLenInfo.from_seqlens(seqlens), _SeqLenInfo.from_seqlens(seqlens), batch_sizes)
        packed = torch.cat([t.reshape(1, -1, *t.shape[2:]) for t in tensors], dim=1)
        return bias, packed

    def split_queries(self, tensor):
        return self.q_seqinfo.split(tensor)

    def split_kv(self, tensor):
        return self.k_seqinfo.split(tensor)

    def split(self, tensor):
        """Back from (1, total, ...) to the list of (batch, seqlen, ...) it was packed from."""
        pieces = self.q_seqinfo.split(tensor)
        if self._batch_sizes is None:
            return pieces
        out, at = [], 0
        for size in self._batch_sizes:
            out.append(torch.cat(pieces[at:at + size]))
            at += size
        return out

    def _derived(self, cls, **extra):
        made = cls(self.q_seqinfo, self.k_seqinfo, self._batch_sizes)
        for name, value in extra.items():
            setattr(made, name, value)
        return made

    def make_causal(self):
        return self._derived(BlockDiagonalCausalMask)

    def make_causal_from_bottomright(self):
        return self._derived(BlockDiagonalCausalFromBottomRightMask)

    def make_local_attention(self, window_size: int):
        return self._derived(BlockDiagonalCausalLocalAttentionMask, _window_size=window_size,
                             window=(window_size - 1, 0))

    def make_local_attention_from_bottomright(self, window_size: int):
        return self._derived(BlockDiagonalCausalLocalAttentionFromBottomRightMask,
                             _window_size=window_size, window=(window_size - 1, 0))

    def _blocks(self):
        return zip(self.q_seqinfo.intervals(), self.k_seqinfo.intervals())

    def _attend(self, q, k, v, scale, p):
        if q.shape[0] != 1:
            raise ValueError(f"{type(self).__name__} needs packed inputs with a batch of 1, "
                             f"got {q.shape[0]}")
        pieces = [attention(q[:, qa:qb], k[:, ka:kb], v[:, ka:kb], scale=scale,
                            causal=self.causal, window=self.window, dropout_p=p,
                            top_left=self.top_left)
                  for (qa, qb), (ka, kb) in self._blocks()]
        return torch.cat(pieces, dim=1)

    def _additive(self, q, k, dtype):
        bias = torch.full((q.shape[1], k.shape[1]), float("-inf"), dtype=dtype, device=q.device)
        for (qa, qb), (ka, kb) in self._blocks():
            block = AttentionBias()
            block.causal, block.window, block.top_left = self.causal, self.window, self.top_left
            bias[qa:qb, ka:kb] = block._additive(q[:, qa:qb], k[:, ka:kb], dtype)
        return bias


class BlockDiagonalCausalMask(BlockDiagonalMask):
    """Packed sequences, causal within each (top left)."""

    causal = True


class BlockDiagonalCausalFromBottomRightMask(BlockDiagonalMask):
    """Packed sequences, causal within each, the last query seeing every key of its block."""

    causal = True
    top_left = False


class BlockDiagonalCausalLocalAttentionMask(BlockDiagonalCausalMask):
    """Packed sequences, causal with a window of ``_window_size`` keys."""


class BlockDiagonalCausalLocalAttentionFromBottomRightMask(BlockDiagonalCausalFromBottomRightMask):
    """Packed sequences, bottom-right causal with a window of ``_window_size`` keys."""
