"""The `strata` command as a person runs it."""

import subprocess
import sys


def strata(*args):
    return subprocess.run([sys.executable, "-m", "strata", *map(str, args)], capture_output=True, text=True)


def test_make_model_info_and_run_on_a_dense_model(tmp_path):
    path = tmp_path / "q3.gguf"
    made = strata("make-model", "--arch", "qwen3", "--preset", "tiny", "--quant", "Q4_0", "-o", path)
    assert made.returncode == 0 and made.stdout.strip() == f"wrote {path}", made.stderr
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


def test_chat_keeps_going_past_a_mistyped_command_and_a_message_too_long(tiny_moe):
    """An unknown /command is not sent as a message; a message past the context is refused in a line and the
    session goes on (it ended the program, and the conversation with it)."""
    long = "many words " * 40
    session = subprocess.run([sys.executable, "-m", "strata", "chat", str(tiny_moe), "-n", "4", "--seed", "0",
                              "--ctx", "64"], input=f"/rest\n{long}\nhello\n/quit\n", capture_output=True,
                             text=True, timeout=300)
    assert session.returncode == 0, session.stderr
    assert "(unknown command /rest)" in session.stderr
    assert "longer than the context" in session.stderr and "/reset starts over)" in session.stderr
    assert session.stdout.count("> ") >= 4  # every line was read (the long message ended the program)


def test_bad_arguments_are_one_line_errors(tiny_moe):
    result = strata("run", tiny_moe, "-p", "x", "--top-p", "0")
    assert result.returncode == 2 and result.stderr.strip() == "strata: error: sampling: top_p must be in (0, 1]"
    result = strata("make-model", "--preset", "huge", "-o", "/tmp/never.gguf")
    assert result.returncode == 2 and "unknown --preset huge" in result.stderr
    # counts of nothing and ports past 65535: argparse's line naming the option (they were tracebacks)
    for args, says in [(("bench", "decode", tiny_moe, "--tokens", "0"), "argument --tokens: at least 1, not 0"),
                       (("bench", "generate", tiny_moe, "--reps", "-2"), "argument --reps: at least 1, not -2"),
                       (("bench", "spec", tiny_moe, "--gen-tokens", "x"), "argument --gen-tokens: a whole number"),
                       (("serve", tiny_moe, "--port", "99999"), "argument --port: between 0 and 65535, not 99999"),
                       (("make-model", "--layers", "0", "-o", "/tmp/never.gguf"), "argument --layers: at least 1"),
                       (("run", tiny_moe, "-p", "x", "--ctx", "0"), "n_ctx must be in 1..524288, got 0")]:
        result = strata(*args)
        assert result.returncode == 2 and says in result.stderr.strip().splitlines()[-1], (args, result.stderr)


def test_offload_flags_plan_and_profile(tiny_moe, tmp_path):
    plan = strata("info", tiny_moe, "--plan", "--expert-cache", "5")
    assert plan.returncode == 0 and "5 of 16 experts (31.2%)" in plan.stdout, plan.stderr
    profile = tmp_path / "p.json"
    made = strata("profile", tiny_moe, "some text to route through the experts", "-o", profile, "--device", "cpu")
    assert made.returncode == 0 and profile.exists(), made.stderr
    (tmp_path / "a_file").write_text("")
    lost = strata("profile", tiny_moe, "text", "-o", tmp_path / "a_file" / "p.json", "--device", "cpu")
    assert lost.returncode == 2 and "p.json: cannot write there" in lost.stderr  # said before the run, not after
    run = strata("run", tiny_moe, "-p", "Hi", "-n", "4", "--temp", "0", "--device", "cpu", "--expert-cache", "3",
                 "--expert-profile", profile)
    assert run.returncode == 0, run.stderr
    bench = strata("bench", "decode", tiny_moe, "--device", "cpu", "--expert-cache", "4", "--tokens", "4",
                   "--gpu-floor", "bytes")
    assert bench.returncode == 0 and "hit rate" in bench.stdout and "floor" in bench.stdout, bench.stderr
    bad = strata("run", tiny_moe, "-p", "Hi", "--expert-cache", "lots")
    assert bad.returncode == 2 and "--expert-cache must be 'auto' or a number" in bad.stderr


def test_kernel_benches_are_wired():
    for tool, option in (("prompt-attn", "--queries"), ("moe-prefill", "--tokens"), ("cpu-experts", "--formats"),
                         ("gdn-step", "--sweep"), ("expert-gather", "--experts")):
        result = strata("bench", tool, "--help")
        assert result.returncode == 0 and option in result.stdout, result.stderr
    assert strata("run", "m.gguf", "-p", "x", "--bogus").returncode == 2


def test_make_model_mtp_and_run_spec_on_qwen4exp(tmp_path):
    """`--mtp` gives qwen4exp its MTP block, and `run --spec 3` decodes through verify windows."""
    made = strata("make-model", "--arch", "qwen4exp", "--preset", "tiny", "--mtp", "-o", tmp_path / "q4.gguf")
    assert made.returncode == 0, made.stderr
    run = strata("run", tmp_path / "q4-00001-of-00002.gguf", "-p", "Hello", "-n", "6", "--temp", "0", "--spec", "3",
                 "--device", "cpu")
    assert run.returncode == 0, run.stderr
    assert "[spec 3:" in run.stderr


def test_make_model_layers_overrides_the_preset(tmp_path):
    """`--layers 2` writes the preset's shapes with two layers (a few full-size layers profile one layer's cost)."""
    import gguf

    made = strata("make-model", "--arch", "qwen3moe", "--preset", "tiny", "--layers", "3", "-o", tmp_path / "m.gguf")
    assert made.returncode == 0, made.stderr
    assert gguf.GGUFReader(tmp_path / "m.gguf").fields["qwen3moe.block_count"].contents() == 3


def test_run_keeps_no_conversation_checkpoints_unless_asked():
    from strata.cli import _checkpoints, build_parser
    from strata.engine.engine import EngineConfig

    parser = build_parser()
    assert _checkpoints(parser.parse_args(["run", "m.gguf", "-p", "x"])) == 0  # one prompt: nothing to continue
    assert _checkpoints(parser.parse_args(["run", "m.gguf", "-p", "x", "--checkpoints", "3"])) == 3
    assert _checkpoints(parser.parse_args(["chat", "m.gguf"])) == EngineConfig.checkpoints > 0
    assert _checkpoints(parser.parse_args(["serve", "m.gguf"])) == EngineConfig.checkpoints


def test_a_misspelt_switch_in_the_environment_is_said(tiny_moe):
    """A STRATA_ variable no switch declares changes nothing: the command says so, and runs."""
    import os

    env = {**os.environ, "STRATA_PDF": "0", "STRATA_PDL": "0"}
    info = subprocess.run([sys.executable, "-m", "strata", "info", str(tiny_moe)], capture_output=True, text=True,
                          env=env)
    assert info.returncode == 0, info.stderr
    assert "strata: warning: STRATA_PDF is not a Strata switch and changes nothing" in info.stderr
    assert "STRATA_PDL" not in info.stderr  # a declared one is not
