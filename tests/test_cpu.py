"""CPU INT8 facts (trtrepo.cpu): parsing /proc/cpuinfo text of real CPU kinds."""

from __future__ import annotations

from trtrepo.cpu import cpu_int8, parse_cpuinfo

ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes vpclmulqdq
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes vpclmulqdq
"""
SKYLAKE_SP = """model name\t: Intel(R) Xeon(R) Platinum 8168 CPU @ 2.70GHz
flags\t\t: fpu sse4_2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl
"""
ICE_LAKE = """model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags\t\t: fpu sse4_2 avx avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bitalg
"""
ALDER_LAKE = """model name\t: 12th Gen Intel(R) Core(TM) i7-12700
flags\t\t: fpu sse4_2 avx avx2 avx_vnni
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp
"""


def test_avx2_without_vnni_saturates():
    info = parse_cpuinfo(ZEN3)
    assert info.model == "AMD EPYC 7B13" and info.vnni is False and info.flags == ("avx2",)
    assert info.saturates and "no VNNI" in info.describe() and "x64quantprecision" in info.describe()


def test_avx512_without_vnni_saturates():
    info = parse_cpuinfo(SKYLAKE_SP)
    assert info.vnni is False and info.saturates and {"avx512f", "avx512bw"} <= set(info.flags)


def test_vnni_either_flavour_does_not_saturate():
    for text in (ICE_LAKE, ALDER_LAKE):
        info = parse_cpuinfo(text)
        assert info.vnni is True and not info.saturates and "VNNI: INT8" in info.describe()


def test_non_x86_and_unreadable_are_unknown():
    for info in (parse_cpuinfo(ARM, "aarch64"), parse_cpuinfo("", "x86_64")):
        assert info.vnni is None and not info.saturates and "unknown" in info.describe()


def test_this_machine_is_described():
    info = cpu_int8()
    assert info is cpu_int8()  # read once
    assert info.describe()
