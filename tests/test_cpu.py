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


def test_precision_option_only_where_kernels_saturate():
    """session.x64quantprecision=1 only on saturating CPUs: on a VNNI CPU it gives the same
    outputs 2.9x slower (measured), so it must stay unset there."""
    from trtrepo.cpu import X64_QUANT_PRECISION, quant_session_entries

    assert quant_session_entries(parse_cpuinfo(ZEN3)) == {X64_QUANT_PRECISION: "1"}
    assert quant_session_entries(parse_cpuinfo(SKYLAKE_SP)) == {X64_QUANT_PRECISION: "1"}
    assert quant_session_entries(parse_cpuinfo(ICE_LAKE)) == {}
    assert quant_session_entries(parse_cpuinfo(ALDER_LAKE)) == {}
    assert quant_session_entries(parse_cpuinfo(ARM, "aarch64")) == {}
    assert quant_session_entries() == quant_session_entries(cpu_int8())


def _template_rule():
    """The standalone copy of the rule in the Triton model.py template (which imports the Python
    backend's utilities at module level, so only that function is taken out and run)."""
    import ast

    from trtrepo.tritonconfig import template_file

    source = template_file("python_onnx_model.py").read_text()
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "u8s8_saturates")
    namespace: dict = {}
    exec("import platform\n" + ast.get_source_segment(source, fn), namespace)  # noqa: S102
    return namespace["u8s8_saturates"]


def test_template_decides_like_trtrepo(tmp_path):
    rule = _template_rule()
    for name, text, machine in [("zen3", ZEN3, "x86_64"), ("skx", SKYLAKE_SP, "x86_64"), ("icx", ICE_LAKE, "x86_64"),
                                ("adl", ALDER_LAKE, "x86_64"), ("arm", ARM, "aarch64")]:
        path = tmp_path / name
        path.write_text(text)
        assert rule(str(path), machine) == parse_cpuinfo(text, machine).saturates, name
    assert rule(str(tmp_path / "missing"), "x86_64") is False
    assert rule() == cpu_int8().saturates


def test_deploy_notes_name_the_cpu_case():
    """deploy's notes for an INT8 model served by ONNX Runtime: nothing on VNNI CPUs; on CPUs
    that saturate, the speed caveat (python backend) or the --reduce-range advice (onnxruntime
    backend, which cannot set the session option) unless it was taken."""
    from trtrepo.deploy import _cpu_int8_notes

    vnni, zen3 = parse_cpuinfo(ICE_LAKE), parse_cpuinfo(ZEN3)
    assert _cpu_int8_notes("python", False, vnni) == [] and _cpu_int8_notes("onnxruntime", False, vnni) == []
    (python_note,) = _cpu_int8_notes("python", False, zen3)
    assert "x64quantprecision=1" in python_note and "--precision fp32" in python_note
    (ort_note,) = _cpu_int8_notes("onnxruntime", False, zen3)
    assert "--reduce-range" in ort_note
    assert _cpu_int8_notes("onnxruntime", True, zen3) == []
