"""Loops in compiled machine code, and whether each reads memory.

A spin-wait is only a wait if every trip reads memory again: a compiler that proves the read
loop-invariant (AMD's volatile loads lose their volatile bit in Triton 3.6+) hoists it out, and a
program that found its peer's slot empty spins forever. The compile report therefore reads the
final machine code of every split kernel (AMDGCN text, or NVIDIA SASS disassembled from the cubin),
builds its control-flow graph, finds its natural loops (a back edge to a block that dominates its
source, and the blocks that reach the source without passing the head), and asks whether each
innermost loop holds a global or atomic read. The split kernels' only loops are their item loop,
whose body loads the rows, and their wait loops, which hold no other loop: so "every innermost loop
reads memory" holds exactly when no wait loop lost its read.

Text in, facts out: no Triton, no torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class _Block:
    instructions: list[str] = field(default_factory=list)
    successors: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Loop:
    """A natural loop: its head block, its blocks, and the memory reads among their instructions."""

    head: int
    blocks: frozenset[int]
    reads: tuple[str, ...]
    # The source lines (``file.py:N``, the file's base name) the loop's instructions come from,
    # inlined-at lines included where the format gives them.
    lines: frozenset[str] = frozenset()
    # Its instructions' text, block by block in address order (what a trip may issue: both sides
    # of a branch within it).
    instructions: tuple[str, ...] = ()

    @property
    def reads_memory(self) -> bool:
        return bool(self.reads)


@dataclass(frozen=True)
class _Instruction:
    """One instruction as the graph needs it: ``kind`` is "" (falls through), "branch", "call"
    (to ``target``, then falls through) or "end"; ``conditional`` when it may also fall through."""

    text: str
    labels: tuple[str, ...] = ()
    kind: str = ""
    target: str = ""
    conditional: bool = False
    reads: bool = False
    lines: tuple[str, ...] = ()


# AMDGCN: global/buffer/flat loads and atomics (an atomic always reaches memory), and scalar
# loads of global memory.
_AMD_READ = re.compile(r"^(global|buffer|flat)_(load|atomic)\w*|^s_(load|buffer_load)\w*")
_AMD_LABEL = re.compile(r"^(\.?[A-Za-z_][\w.$]*):")
_AMD_BRANCH = re.compile(r"^s_(branch|cbranch_\w+)\s+(\S+)")
# Not s_trap: Triton 3.2's gfx942 kernels open with ``s_trap 2``, which hardware that preloads
# kernel arguments steps over, so the code after it is the kernel's.
_AMD_END = re.compile(r"^s_(endpgm|setpc_b64)\b")

# SASS: global and generic loads (LDG, LD), atomics (ATOM, ATOMG) and asynchronous global copies
# (LDGSTS, bulk copies UBLKCP and UTMALDG); not LDS/LDSM (shared memory) or RED (no value back).
_SASS_READ = re.compile(r"^(LDG|LD|ATOMG|ATOM|LDGSTS|UBLKCP|UTMALDG)(\.|\s|$)")
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_SASS_PREDICATE = re.compile(r"^@!?U?P\w+\s+")
# A jump with an operand before its target (``BRA.DIV UR8, `(.L_x_12)``, ``BRA.U !UP0, ...``) is
# conditional as a predicated one is: it may fall through.
_SASS_JUMP = re.compile(r"^(BRA|CALL)\S*\s+(\S+,\s*)?`?\(?(0x[0-9a-f]+|[.$\w][\w.$]*)\)?")
_NV_LABEL = re.compile(r"^[.$\w][\w.$]*:$")
_SASS_END = re.compile(r"^(EXIT|RET|BPT\.TRAP)\b")


def _dominators(blocks: list[_Block], predecessors: list[set[int]]) -> list[set[int]]:
    """Each block's dominators (the iterative data-flow solution; block 0 is the entry)."""
    every = set(range(len(blocks)))
    dominators = [every.copy() for _ in blocks]
    dominators[0] = {0}
    changed = True
    while changed:
        changed = False
        for n in range(1, len(blocks)):
            incoming = [dominators[p] for p in predecessors[n]]
            new = (set.intersection(*incoming) if incoming else set()) | {n}
            if new != dominators[n]:
                dominators[n], changed = new, True
    return dominators


def _graph(instructions: list[_Instruction]) -> tuple[list[_Block], list[list[str]], list[set[str]]]:
    """Basic blocks (a block starts at a jump target or after a jump or end) and their reads."""
    targets = {ins.target for ins in instructions if ins.kind in ("branch", "call")}
    starts = {0} | {i for i, ins in enumerate(instructions) if targets.intersection(ins.labels)}
    starts |= {i + 1 for i, ins in enumerate(instructions) if ins.kind}
    order = sorted(s for s in starts if s < len(instructions))
    block_of = {label: n for n, start in enumerate(order) for label in instructions[start].labels}
    blocks: list[_Block] = []
    reads: list[list[str]] = []
    lines: list[set[str]] = []
    for n, start in enumerate(order):
        stop = order[n + 1] if n + 1 < len(order) else len(instructions)
        body = instructions[start:stop]
        block = _Block([ins.text for ins in body])
        last = body[-1]
        if last.kind in ("branch", "call") and last.target in block_of:
            block.successors.append(block_of[last.target])
        if (last.kind in ("", "call") or last.conditional) and n + 1 < len(order):
            block.successors.append(n + 1)
        blocks.append(block)
        reads.append([ins.text for ins in body if ins.reads])
        lines.append({line for ins in body for line in ins.lines})
    return blocks, reads, lines


def _loops(instructions: list[_Instruction]) -> list[Loop]:
    """Natural loops of the code reachable from the first instruction."""
    if not instructions:
        return []
    blocks, reads, lines = _graph(instructions)
    predecessors: list[set[int]] = [set() for _ in blocks]
    for n, block in enumerate(blocks):
        for s in block.successors:
            predecessors[s].add(n)
    reachable, stack = {0}, [0]
    while stack:
        for s in blocks[stack.pop()].successors:
            if s not in reachable:
                reachable.add(s)
                stack.append(s)
    dominators = _dominators(blocks, predecessors)
    bodies: dict[int, set[int]] = {}
    for source in reachable:
        for head in blocks[source].successors:
            if head in dominators[source]:  # a back edge
                body = bodies.setdefault(head, {head})
                stack = [source]
                while stack:
                    n = stack.pop()
                    if n not in body:
                        body.add(n)
                        stack.extend(predecessors[n] & reachable)
    return [Loop(head, frozenset(body), tuple(r for n in sorted(body) for r in reads[n]),
                 frozenset(line for n in body for line in lines[n]),
                 tuple(text for n in sorted(body) for text in blocks[n].instructions))
            for head, body in sorted(bodies.items())]


def innermost(loops: list[Loop]) -> list[Loop]:
    """The loops that hold no other loop."""
    return [loop for loop in loops if not any(other.blocks < loop.blocks for other in loops)]


_AMD_LOC = re.compile(r"^\.loc\s")
_SOURCE = re.compile(r"([\w.-]+\.py):(\d+)")
_NV_SOURCE = re.compile(r'//## File "(?:[^"]*/)?([^"/]+)", line (\d+)(?: inlined at "(?:[^"]*/)?([^"/]+)", line (\d+))?')


def amdgcn_loops(asm: str) -> list[Loop]:
    """Natural loops of the first function in AMDGCN assembly text (Triton emits one kernel per
    module, with any called function after it). Source lines come from ``.loc`` comments
    (``exchange.py:380:9 @[ split.py:478:5 ]``: the line and where it was inlined)."""
    instructions: list[_Instruction] = []
    labels: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    for raw in asm.splitlines():
        line, _, comment = raw.partition(";")
        line = line.strip()
        if not line:
            continue
        if _AMD_LOC.match(line):
            lines = tuple(f"{name}:{number}" for name, number in _SOURCE.findall(comment))
            continue
        found = _AMD_LABEL.match(line)
        if found:
            labels += (found.group(1),)
            continue
        if line.startswith("."):
            continue
        branch = _AMD_BRANCH.match(line)
        if branch:
            ins = _Instruction(line, labels, "branch", branch.group(2), line.startswith("s_cbranch_"), lines=lines)
        elif _AMD_END.match(line):
            ins = _Instruction(line, labels, "end", lines=lines)
        else:
            ins = _Instruction(line, labels, reads=bool(_AMD_READ.match(line)), lines=lines)
        instructions.append(ins)
        labels = ()
    return _loops(instructions)


def sass_loops(sass: str) -> list[Loop]:
    """Natural loops in the SASS of one kernel as ``nvdisasm -c -g`` prints it (labels
    ``.L_x_N``, source lines as ``//## File`` comments), its called functions included (a
    pipelined split kernel calls its wait)."""
    instructions: list[_Instruction] = []
    labels: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    for raw in sass.splitlines():
        stripped = raw.strip()
        source = _NV_SOURCE.search(stripped)
        if source:
            name, number, outer, outer_number = source.groups()
            lines = (f"{name}:{number}",) + ((f"{outer}:{outer_number}",) if outer else ())
            continue
        if _NV_LABEL.match(stripped):
            labels += (stripped[:-1],)
            continue
        match = _SASS_LINE.search(raw)
        if not match:
            continue
        text = match.group(2).strip()
        labels += (f"0x{int(match.group(1), 16):x}",)
        plain = _SASS_PREDICATE.sub("", text)
        conditional = plain != text
        jump = _SASS_JUMP.match(plain)
        if jump:
            kind = "call" if jump.group(1) == "CALL" else "branch"
            conditional = conditional or bool(jump.group(2))
            target = jump.group(3)
            target = f"0x{int(target, 16):x}" if target.startswith("0x") else target
            ins = _Instruction(text, labels, kind, target, conditional, lines=lines)
        elif _SASS_END.match(plain):
            ins = _Instruction(text, labels, "end", conditional=conditional, lines=lines)
        else:
            ins = _Instruction(text, labels, reads=bool(_SASS_READ.match(plain)), lines=lines)
        instructions.append(ins)
        labels = ()
    return _loops(instructions)


def wait_loops(loops: list[Loop], source_line: str) -> list[Loop]:
    """The loops with code from ``source_line`` (``exchange.py:N``, the wait's ``while``), that
    hold no other such loop."""
    found = [loop for loop in loops if source_line in loop.lines]
    return [loop for loop in found if not any(other.blocks < loop.blocks for other in found)]
