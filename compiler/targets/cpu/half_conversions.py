"""IEEE binary16 conversions for kernel libraries, defined in the kernel's own module.

Where the CPU has no instruction for a conversion (f32 <-> f16 below x86-64-v3's F16C, f64 -> f16
below AVX512-FP16, which no x86-64 level includes), LLVM calls the compiler runtime's
`__extendhfsf2`, `__truncsfhf2` and `__truncdfhf2`. A kernel library links libm and libgomp only
(codegen.py), and libgcc's copies exist only from GCC 12 on, so the module carries its own:
internal, kept alive to code generation by `llvm.compiler.used`, so that the calls LLVM emits
bind to them inside the library.

Rounding is to nearest, ties to even, through subnormals (an addition aligns the 10 fraction
bits, as in Fabian Giesen's float_to_half_fast3_rtne), overflow gives inf, NaNs keep their sign
and leading payload bits and come out quiet, as F16C's vcvtps2ph does.
"""
from __future__ import annotations

NAMES = ("__extendhfsf2", "__truncsfhf2", "__truncdfhf2")


def _truncate(name: str, src: str, bits: int, exponent_bits: int) -> str:
    """`half @name(src)` for a binary float of `bits` bits with `exponent_bits` exponent bits."""
    fraction = bits - 1 - exponent_bits
    bias = (1 << (exponent_bits - 1)) - 1
    shift = fraction - 10                        # the fraction bits dropped
    i = f"i{bits}"
    abs_mask = (1 << (bits - 1)) - 1
    inf = ((1 << exponent_bits) - 1) << fraction
    half_overflow = (bias + 16) << fraction       # 2^16: from here on inf (or NaN)
    half_normal = (bias - 14) << fraction         # 2^-14: below it a subnormal half or zero
    align = (bias + fraction - 24) << fraction    # 2^(fraction - 24): its unit is 2^-24, the subnormal step
    align_value = float(2.0 ** (fraction - 24))
    rebias = ((15 - bias) << fraction) + (1 << (shift - 1)) - 1  # the exponent to f16's, and half a unit less one
    return f"""define internal half @{name}({src} %value) nounwind {{
  %x = bitcast {src} %value to {i}
  %abs = and {i} %x, {abs_mask}
  %top = lshr {i} %x, {bits - 16}
  %sign = and {i} %top, 32768
  %kept = lshr {i} %abs, {shift}
  %payload = and {i} %kept, 1023
  %quiet = or {i} %payload, 32256
  %is_nan = icmp ugt {i} %abs, {inf}
  %big = select i1 %is_nan, {i} %quiet, {i} 31744
  %abs_value = bitcast {i} %abs to {src}
  %aligned_value = fadd {src} %abs_value, {align_value!r}
  %aligned = bitcast {src} %aligned_value to {i}
  %small = sub {i} %aligned, {align}
  %odd = and {i} %kept, 1
  %biased = add {i} %abs, {rebias}
  %rounded = add {i} %biased, %odd
  %normal = lshr {i} %rounded, {shift}
  %is_small = icmp ult {i} %abs, {half_normal}
  %is_big = icmp uge {i} %abs, {half_overflow}
  %finite = select i1 %is_small, {i} %small, {i} %normal
  %magnitude = select i1 %is_big, {i} %big, {i} %finite
  %signed = or {i} %magnitude, %sign
  %bits16 = trunc {i} %signed to i16
  %h = bitcast i16 %bits16 to half
  ret half %h
}}
"""


EXTEND = """define internal float @__extendhfsf2(half %h) nounwind {
  %bits16 = bitcast half %h to i16
  %w = zext i16 %bits16 to i32
  %sign = and i32 %w, 32768
  %sign32 = shl i32 %sign, 16
  %abs = and i32 %w, 32767
  %exponent = and i32 %w, 31744
  %fraction = and i32 %w, 1023
  %shifted = shl i32 %abs, 13
  %normal = add i32 %shifted, 939524096
  %is_nan = icmp ugt i32 %abs, 31744
  %quiet = select i1 %is_nan, i32 4194304, i32 0
  %inf_or_nan = or i32 %shifted, 2139095040
  %special = or i32 %inf_or_nan, %quiet
  %fraction_value = uitofp i32 %fraction to float
  %subnormal_value = fmul float %fraction_value, 0x3E70000000000000
  %subnormal = bitcast float %subnormal_value to i32
  %is_special = icmp eq i32 %exponent, 31744
  %is_subnormal = icmp eq i32 %exponent, 0
  %wide = select i1 %is_special, i32 %special, i32 %normal
  %magnitude = select i1 %is_subnormal, i32 %subnormal, i32 %wide
  %signed = or i32 %magnitude, %sign32
  %f = bitcast i32 %signed to float
  ret float %f
}
"""


def half_conversions_ir() -> str:
    """The three functions and the `llvm.compiler.used` entry that keeps them."""
    used = ", ".join(f"ptr @{name}" for name in NAMES)
    return (EXTEND + _truncate("__truncsfhf2", "float", 32, 8) + _truncate("__truncdfhf2", "double", 64, 11)
            + f'@llvm.compiler.used = appending global [{len(NAMES)} x ptr] [{used}], section "llvm.metadata"\n')


def with_half_conversions(module_text: str) -> str:
    """`module_text` plus the conversions where it has f16 values (its text names `half`)."""
    return module_text + "\n" + half_conversions_ir() if " half" in module_text else module_text
