"""benchmarks/sass_attention_loop.py on a synthetic cuobjdump listing: the innermost loop holding an HMMA is the
round body, its counts and the order of its loads and products."""

from __future__ import annotations

import benchmark_scripts

LISTING = """
\t\tFunction : _ZN3kog17monokernel_kernelILi64ELi4ELb0ELb0ELb0EEEvNS_8StepArgsE
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDS R2, [R3] ;
        /*0020*/                   LDG.E.128.STRONG.GPU R4, desc[UR4][R2.64] ;
        /*0030*/               @P0 LDG.E.128.STRONG.GPU R8, desc[UR4][R2.64+0x10] ;
        /*0040*/                   HMMA.16816.F32.BF16 R12, R4, R16, RZ ;
        /*0050*/                   SHFL.BFLY PT, R20, R12, 0x4, 0x1f ;
        /*0060*/                   MUFU.EX2 R21, R20 ;
        /*0070*/                   LDG.E.128.STRONG.GPU R24, desc[UR4][R2.64+0x20] ;
        /*0080*/                   HMMA.16816.F32.BF16 R28, R24, R16, R28 ;
        /*0090*/              @!P1 BRA 0x10 ;
        /*00a0*/                   LDG.E R30, desc[UR4][R2.64] ;
        /*00b0*/               @P2 BRA 0x0 ;
        /*00c0*/                   EXIT ;
\t\tFunction : _ZN3kog2ar14oneshot_kernelIfLi8EEEvNS0_6ParamsE
        /*0000*/                   HMMA.16816.F32.BF16 R12, R4, R16, RZ ;
        /*0010*/                   BRA 0x0 ;
"""


def test_round_body_is_the_innermost_loop_with_products():
    mod = benchmark_scripts.load("sass_attention_loop")
    ks = mod.parse_sass(LISTING)
    assert list(ks) == ["Li64ELi4ELb0ELb0ELb0E"]  # the all-reduce kernel is not a monokernel instantiation
    n, ops, order = mod.summary(ks["Li64ELi4ELb0ELb0ELb0E"])
    assert n == 9  # 0x10 .. 0x90, not the outer loop from 0x0
    assert (ops["LDG"], ops["HMMA"], ops["BRA"], ops["LDS"]) == (3, 2, 1, 1)
    assert order == "dLLMSELM"  # the third load waits for a second round trip after the first product
    assert mod.opcode("@!P1 BRA 0x10") == "BRA" and mod.opcode("@P0 LDG.E.128 R8, [R2]") == "LDG"


def test_local_memory_in_gemv_loops():
    mod = benchmark_scripts.load("sass_attention_loop")
    ins = [
        (0x00, "STL [R1+0x8], R2"),
        (0x10, "FFMA R3, R4, R5, R3"),
        (0x20, "LDL R6, [R1+0x8]"),
        (0x30, "@P0 BRA 0x10"),  # a GEMV-like loop with one reload
        (0x40, "LDL R7, [R1+0xc]"),
        (0x50, "IADD3 R8, R8, 0x1, RZ"),
        (0x60, "@P1 BRA 0x40"),  # a loop without FFMA: not counted as hot
    ]
    assert mod.local_accesses(ins) == (1, 2, 1)


def test_no_loop_with_products():
    mod = benchmark_scripts.load("sass_attention_loop")
    assert mod.summary([(0, "HMMA.16816.F32.BF16 R1, R2, R3, RZ"), (16, "EXIT")]) is None
