"""The decorator and the ``triton.language`` that this copy of the kernel package compiles with.

The package is loaded twice: as ``portable_softmax.kernels`` for GPU compilation and as
``portable_softmax.kernels_interpreted`` (see ``interpreter.py``) to run CPU tensors through
Triton's interpreter; the package's name picks the decorator for each. Every module of the
package takes ``_jit``, ``tl`` and ``_language`` from here, so that both copies hold their own.
"""
import triton
import triton.language as tl

# The interpreter looks for triton.language itself among a function's globals (it patches that
# module for the duration of a launch): every module of the package imports ``_language``.
_language = tl

if __package__.endswith("_interpreted"):
    from portable_softmax.interpreter import interpreted_language, kernel_decorator as _jit

    tl = interpreted_language()
    _jit_call = _jit
else:
    _jit = triton.jit
    # For a function that the caller calls rather than inlines (its arguments must be scalars).
    _jit_call = triton.jit(noinline=True)
