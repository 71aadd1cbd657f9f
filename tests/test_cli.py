"""The `strata` command as a person runs it."""

import subprocess
import sys


def strata(*args):
    return subprocess.run([sys.executable, "-m", "strata", *map(str, args)], capture_output=True, text=True)


def test_make_model_info_and_run_on_a_dense_model(tmp_path):
    path = tmp_path / "q3.gguf"
    made = strata("make-model", "--arch", "qwen3", "--preset", "tiny", "--quant", "Q4_0", "-o", path)
    assert made.returncode == 0, made.stderr
    info = strata("info", path, "--ctx", "1024")
    assert info.returncode == 0, info.stderr
    assert "qwen3: 2 layers, hidden 64" in info.stdout and "Q4_0" in info.stdout and "KV cache" in info.stdout
    run = strata("run", path, "-p", "Hello", "-n", "6", "--seed", "1", "--device", "cpu")
    assert run.returncode == 0, run.stderr
    assert "tok/s" in run.stderr and "finish:" in run.stderr


def test_info_and_run_on_a_transformers_export(hf_exports):
    _, path = hf_exports.get("qwen3moe", "Q8_0")
    info = strata("info", path)
    assert info.returncode == 0 and "experts       8 per layer, top 2" in info.stdout
    run = strata("run", path, "-p", "Bonjour", "-n", "4", "--temp", "0", "--chat")
    assert run.returncode == 0, run.stderr


def test_chat_session_reset_and_quit(tiny_moe):
    session = subprocess.run([sys.executable, "-m", "strata", "chat", str(tiny_moe), "-n", "4", "--seed", "0"],
                             input="hello\n/reset\nagain\n/quit\n", capture_output=True, text=True, timeout=300)
    assert session.returncode == 0, session.stderr
    assert "(conversation cleared)" in session.stderr


def test_bad_arguments_are_one_line_errors(tiny_moe):
    result = strata("run", tiny_moe, "-p", "x", "--top-p", "0")
    assert result.returncode == 2 and result.stderr.strip() == "strata: error: sampling: top_p must be in (0, 1]"
    result = strata("make-model", "--preset", "huge", "-o", "/tmp/never.gguf")
    assert result.returncode == 2 and "unknown --preset huge" in result.stderr
