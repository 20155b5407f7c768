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
    """A ``DEPENDENT`` kernel's first instructions (module docstring): the next kernel may start,
    and this one waits for the one before it."""
    _release_next(DEPENDENT)
    _await_prior(DEPENDENT)


@_jit
def _await_prior(DEPENDENT: tl.constexpr):
    """Wait, with ``DEPENDENT``, until the kernel before this one in the stream has finished and
    its memory operations are seen (``griddepcontrol.wait``). A no-op where the launch did not
    ask to overlap it."""
    if DEPENDENT:
        tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@_jit
def _release_next(DEPENDENT: tl.constexpr):
    """Let the stream's next kernel, if launched to overlap, start once every program of this one
    has passed here (``griddepcontrol.launch_dependents``): it waits for this one's end itself
    before reading what this one writes."""
    if DEPENDENT:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)
