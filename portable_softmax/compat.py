"""Differences between the Triton versions users have (3.2 for triton-ascend, 3.6, 3.9), behind
version checks."""
from __future__ import annotations

import triton
from packaging.version import Version

TRITON_VERSION = Version(Version(triton.__version__).base_version)

# kernel[grid](..., launch_cooperative_grid=True) asks the driver to refuse a grid that is not
# resident all at once, instead of letting waiting programs hang.
COOPERATIVE_LAUNCH = TRITON_VERSION >= Version("3.3")

# triton.compiler.ASTSource took ``constants=`` before it took ``constexprs=``.
AST_SOURCE_CONSTEXPRS = TRITON_VERSION >= Version("3.3")


def ast_source(fn, signature: dict, constexprs: dict, divisible_by_16=()):
    """An ASTSource for ``fn`` with ``signature`` ({name: type or "constexpr"}) and constexpr values.

    ``divisible_by_16`` names the arguments a launch would specialise as multiples of 16 (pointers
    aligned to 16 bytes, integers divisible by 16), as ``kernel[grid](...)`` does from the values
    it sees; without them the binary is the unaligned, unvectorised one.
    """
    names = list(signature)
    if AST_SOURCE_CONSTEXPRS:
        attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in divisible_by_16}
        return triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    # Triton 3.2 keys constants by parameter name ("Constants keys must be string").
    constants = dict(constexprs)
    attrs = None
    if divisible_by_16:
        # Triton < 3.3 described specialisations with an AttrsDescriptor.
        from triton.backends.compiler import AttrsDescriptor

        attrs = AttrsDescriptor.from_hints({names.index(name): 16 for name in divisible_by_16})
    return triton.compiler.ASTSource(fn=fn, signature={k: v for k, v in signature.items() if k not in constexprs},
                                     constants=constants, attrs=attrs)

# A compiled kernel launched as ``compiled[grid](*every_argument)``, constexprs included, the way
# JITFunction.run launches it: the code read in Triton 3.6 and 3.9. Older versions take the
# ``kernel[grid]`` path on every call.
DIRECT_LAUNCH = TRITON_VERSION >= Version("3.6")
