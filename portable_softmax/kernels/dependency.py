"""Launches that overlap the kernel before them in the stream (NVIDIA Hopper's programmatic
dependent launch; ``DeviceRecord.dependent_launch``).

A kernel compiled with ``DEPENDENT`` begins with ``_overlapped``: it lets the stream's next kernel
start once each of its programs has begun (``griddepcontrol.launch_dependents``), and waits for
the kernel before it to finish, its writes seen (``griddepcontrol.wait``), before it touches
memory: launched to overlap (Triton's ``launch_pdl``), whatever that kernel was. What the overlap
saves is the launch between them, about 1 us each on an H200: the one-program sum is resident
before the forward ahead of it ends, the rescale before torch's ones (the forward alone of short
rows 1-3 us a call faster, NOTES v42). A split grid launched cooperatively starts only once the
kernel ahead of it has ended: it asks for no overlap (``variants.options``). A wait later in a kernel would let it load before the
kernel ahead ends, but one inside the split forward's item loop, after the first item's loads,
cost 15 us a call on 4096x256000 (NOTES v42). Launched without the attribute both
instructions are no-ops; without ``DEPENDENT`` (other targets, the interpreter) nothing is
compiled. (Inline assembly, as Triton 3.6's own ``gdc_wait``: the PTX instructions exist from
sm_90 on.)
"""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)


@_jit
def _overlapped(DEPENDENT: tl.constexpr):
    """A ``DEPENDENT`` kernel's first instructions (module docstring): the stream's next kernel, if
    launched to overlap, may start once every program of this one has passed here; then this one
    waits until the kernel before it has finished and its memory operations are seen (a no-op
    where this launch did not ask to overlap it)."""
    if DEPENDENT:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)
        tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
