"""Loops in machine code and their memory reads (``portable_softmax.machine_code``), on short
hand-written SASS and AMDGCN in the form the compilers print: no compiler needed."""
from __future__ import annotations

from portable_softmax import machine_code

WAIT = "exchange.py:328"

SASS_WAIT = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
	//## File "/x/exchange.py", line 313
        /*0010*/                   LDG.E.64.STRONG.SYS R26, desc[UR10][R44.64] ;
.L_x_1:
	//## File "/x/exchange.py", line 313
        /*0020*/                   {READ}
	//## File "/x/exchange.py", line 328
        /*0030*/                   ISETP.GE.AND P1, PT, R19, 0x1, PT ;
        /*0040*/               @P1 BRA `(.L_x_1) ;
        /*0050*/                   EXIT ;
.L_x_2:
        /*0060*/                   BRA `(.L_x_2);
"""

AMD_WAIT = """
k:
	s_load_dwordx2 s[2:3], s[0:1], 0x0
.LBB0_1:
	.loc	1 291 0                 ; exchange.py:291:0
	v_readfirstlane_b32 s56, v86
	s_andn2_b64 exec, exec, s[54:55]
	s_cbranch_execnz .LBB0_1
.LBB0_2:
	.loc	1 313 9                 ; exchange.py:313:9 @[ exchange.py:328:5 ]
	{READ}
	.loc	1 328 5                 ; exchange.py:328:5
	s_cmp_gt_i32 s3, 0
	s_cbranch_scc1 .LBB0_2
	s_endpgm
"""


def test_a_sass_wait_that_rereads_memory():
    loops = machine_code.sass_loops(SASS_WAIT.replace("{READ}", "LDG.E.64.STRONG.SYS R26, desc[UR10][R44.64] ;"))
    waits = machine_code.wait_loops(loops, WAIT)
    # The unreachable self-branch after EXIT is no loop.
    assert len(loops) == 1 and len(waits) == 1 and waits[0].reads_memory


def test_a_sass_wait_whose_read_was_hoisted():
    loops = machine_code.sass_loops(SASS_WAIT.replace("{READ}", "IMAD.MOV R26, RZ, RZ, R27 ;"))
    waits = machine_code.wait_loops(loops, WAIT)
    assert len(waits) == 1 and not waits[0].reads_memory


SASS_DIVERGENT_WAIT = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
	//## File "/x/exchange.py", line 313
        /*0010*/                   LDG.E.64.STRONG.SYS R26, desc[UR10][R44.64] ;
	//## File "/x/exchange.py", line 328
        /*0020*/                   BRA.DIV UR8, `(.L_x_3) ;
        /*0030*/                   REDUX.SUM.S32 UR5, R118 ;
.L_x_4:
        /*0040*/                   ISETP.GE.AND P1, PT, R19, 0x1, PT ;
        /*0050*/               @P1 BRA `(.L_x_1) ;
        /*0060*/                   EXIT ;
.L_x_3:
	//## File "/x/standard.py", line 290
        /*0070*/                   SHFL.BFLY PT, R9, R8, 0x10, 0x1f ;
        /*0080*/                   BRA `(.L_x_4) ;
"""


def test_a_divergence_branch_falls_through():
    """Triton 3.6's SASS puts a ``BRA.DIV UR8, ...`` inside the wait loop, to a block that comes
    back into it: the branch is taken only where the warp diverged, so the loop's back edge also
    follows it (read as unconditional, the loop vanished from the graph)."""
    waits = machine_code.wait_loops(machine_code.sass_loops(SASS_DIVERGENT_WAIT), WAIT)
    assert len(waits) == 1 and waits[0].reads_memory and len(waits[0].blocks) == 4


def test_amd_wait_loops_and_lane_loops():
    kept = machine_code.amdgcn_loops(AMD_WAIT.replace("{READ}", "buffer_atomic_add_x2 v[86:87], v68, s[24:27], 0 offen sc0"))
    hoisted = machine_code.amdgcn_loops(AMD_WAIT.replace("{READ}", "v_mov_b32_e32 v1, v2"))
    # The exec-mask loop over lanes (line 291) has no read and is no wait.
    assert len(kept) == 2 and [loop.reads_memory for loop in kept] == [False, True]
    # A loop's instructions are its blocks' (probes/loop_instructions.py counts them).
    assert set(kept[1].reads) <= set(kept[1].instructions) and len(kept[1].instructions) > len(kept[1].reads)
    assert [w.reads_memory for w in machine_code.wait_loops(kept, WAIT)] == [True]
    assert [w.reads_memory for w in machine_code.wait_loops(hoisted, WAIT)] == [False]


def test_no_line_information_finds_no_wait():
    loops = machine_code.amdgcn_loops(AMD_WAIT.replace("{READ}", "v_mov_b32_e32 v1, v2").replace("exchange.py", "x.py"))
    assert machine_code.wait_loops(loops, WAIT) == []
