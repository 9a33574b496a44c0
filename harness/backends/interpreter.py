"""Triton's CPU interpreter, corrected where it takes a bf16 tensor's bits for its value.

The interpreter keeps a bf16 tensor as raw ``uint16``: dots, arithmetic, comparisons and reductions
work on the bit patterns, and an fp32 -> bf16 cast truncates. :func:`correct_bf16` makes each decode
to fp32, compute, and round back to nearest even, as a GPU does."""

import os

import numpy as np

_COMPARISONS = frozenset({np.less, np.less_equal, np.greater, np.greater_equal, np.equal, np.not_equal})
_SAVED: dict[tuple[type, str], object] = {}  # the interpreter's own methods while corrected


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def bf16_to_fp32(bits: np.ndarray) -> np.ndarray:
    """bf16 stored as uint16 bits -> the same values as float32 (exact)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def fp32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 (or float64, through float32) -> bf16 bits as uint16, rounded to nearest even; NaN stays NaN."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    quiet_nan = ((bits >> 16) | np.uint32(0x0040)).astype(np.uint16)  # the sign and a quiet NaN's top bits
    return np.where(np.isnan(values), quiet_nan, rounded)


def _corrections():
    """(class, method name, corrected method) of every correction; imports Triton's interpreter."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder, reduce_ops, handle = interpreter.InterpreterBuilder, interpreter.ReduceOps, interpreter.TensorHandle
    bf16 = tl.bfloat16
    original_min_max, original_sum = reduce_ops.min_max, reduce_ops.sum

    def as_fp32(h):
        return handle(bf16_to_fp32(h.data), tl.float32) if h.dtype.scalar == bf16 else h

    def cast_impl(self, src, dst_type):
        if dst_type.scalar == bf16 and src.dtype.scalar in (tl.float32, tl.float64):
            return handle(fp32_to_bf16(src.data), bf16)
        return original["cast_impl"](self, src, dst_type)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original["create_dot"](self, as_fp32(a), as_fp32(b), d, input_precision, max_num_imprecise_acc)

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar != bf16 or rhs.dtype.scalar != bf16:
            return original["binary_op"](self, lhs, rhs, op)
        result = original["binary_op"](self, as_fp32(lhs), as_fp32(rhs), op)
        return result if op in _COMPARISONS else handle(fp32_to_bf16(result.data), bf16)

    def unary_op(self, arg, op):
        if arg.dtype.scalar != bf16:
            return original["unary_op"](self, arg, op)
        return handle(fp32_to_bf16(original["unary_op"](self, as_fp32(arg), op).data), bf16)

    def create_fma(self, x, y, z):
        if z.dtype.scalar != bf16:
            return original["create_fma"](self, x, y, z)
        wide = [bf16_to_fp32(h.data).astype(np.float64) for h in (x, y, z)]
        return handle(fp32_to_bf16(wide[0] * wide[1] + wide[2]), bf16)  # a bf16 fma rounds once

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        value = input[0] if isinstance(input, tuple) else input
        if value.dtype.scalar != bf16:
            return original_min_max(self, input, val_reduce_op, idx_reduce_op)
        data = bf16_to_fp32(value.handle.data)
        found = val_reduce_op(data, axis=self.axis, keepdims=self.keep_dims) if val_reduce_op else None
        index = idx_reduce_op(data, axis=self.axis, keepdims=self.keep_dims) if idx_reduce_op else None
        found = None if found is None else self.to_tensor(fp32_to_bf16(np.asarray(found)).reshape(np.shape(found)),
                                                          value.dtype)  # fmt: skip
        index = None if index is None else self.to_tensor(index, tl.int32)
        return found if index is None else index if found is None else (found, index)

    def reduce_sum(self, input):
        if input.dtype.scalar != bf16:
            return original_sum(self, input)
        total = np.sum(bf16_to_fp32(input.handle.data), axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(fp32_to_bf16(np.asarray(total)).reshape(np.shape(total)), input.dtype)

    methods = {"cast_impl": cast_impl, "create_dot": create_dot, "binary_op": binary_op, "unary_op": unary_op,
               "create_fma": create_fma}  # fmt: skip
    original = {name: getattr(builder, name) for name in methods}  # what each correction calls through to
    reductions = [(reduce_ops, "min_max", min_max), (reduce_ops, "sum", reduce_sum)]
    return [(builder, name, method) for name, method in methods.items()] + reductions


def correct_bf16() -> bool:
    """Correct the interpreter's bf16 in this process, once; False (nothing done) without the interpreter or Triton."""
    if not interpreting():
        return False
    if _SAVED:
        return True
    try:
        corrections = _corrections()
    except ImportError:
        return False
    for cls, name, method in corrections:
        _SAVED[(cls, name)] = cls.__dict__[name]
        setattr(cls, name, method)
    return True


def restore_bf16() -> None:
    while _SAVED:
        (cls, name), method = _SAVED.popitem()
        setattr(cls, name, method)


def bf16_corrected() -> bool:
    return bool(_SAVED)
