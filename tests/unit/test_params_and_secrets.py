"""MLflow params are flat, legal and free of secrets; server commands are redacted for display."""

from __future__ import annotations

import pytest

from orchestrator.config.secrets import (
    hide,
    is_secret_name,
    redact_argv,
    redact_mapping,
    redact_override,
    redact_text,
    scrub_file,
    secret_values,
)
from orchestrator.engines.base import ServerLaunch
from orchestrator.tracking.params import flatten_params, sanitize_key


def test_flatten_nested_and_lists():
    out = flatten_params({"engine": {"block_size": 32, "extra_args": ["--a", "1"], "seed": None}, "x": {}})
    assert out == {"engine.block_size": "32", "engine.extra_args": '["--a", "1"]', "engine.seed": "null", "x": "{}"}


def test_sanitize_key():
    assert sanitize_key("vllm:prefix_cache_hits") == "vllm_prefix_cache_hits"
    assert len(sanitize_key("k" * 400)) == 250


def test_secret_names():
    for name in ("HF_TOKEN", "--hf-token", "VLLM_API_KEY", "api_key", "AWS_SECRET_ACCESS_KEY", "db_password"):
        assert is_secret_name(name), name
    for name in ("max_num_batched_tokens", "--max-num-batched-tokens", "output_tokens", "author", "tokenizer"):
        assert not is_secret_name(name), name


def test_params_hide_secrets():
    out = flatten_params({"engine": {"env": {"HF_TOKEN": "hf_abcdefghijkl", "OTHER": "see hf_abcdefghijkl"}}})
    assert out["engine.env.HF_TOKEN"] == "***"
    assert "hf_abcdefghijkl" not in out["engine.env.OTHER"]


def test_redact_argv_and_env():
    argv = [
        "python",
        "--api-key",
        "sk-supersecretvalue",
        "--hf-token=hf_abcdefghijk",
        "--max-num-batched-tokens",
        "256",
    ]
    assert redact_argv(argv) == ["python", "--api-key", "***", "--hf-token=***", "--max-num-batched-tokens", "256"]
    launch = ServerLaunch(
        "server", argv, {"HF_TOKEN": "hf_x", "VLLM_CPU_KVCACHE_SPACE": "2"}, "127.0.0.1", 1, role="server"
    )
    shown = launch.redacted()
    assert shown["env"] == {"HF_TOKEN": "***", "VLLM_CPU_KVCACHE_SPACE": "2"}
    assert "sk-supersecretvalue" not in str(shown)


def test_redact_text():
    assert redact_text("token hf_abcdefghijklmnop used") == "token *** used"


def test_redact_override_and_mapping():
    assert redact_override("engine.env.HF_TOKEN=hf_abcdefghijkl") == "engine.env.HF_TOKEN=***"
    assert redact_override("+engine.env.VLLM_API_KEY=x") == "+engine.env.VLLM_API_KEY=***"
    assert redact_override("engine.max_num_batched_tokens=256") == "engine.max_num_batched_tokens=256"
    spec = {
        "engine": {
            "env": {"HF_TOKEN": "abc", "X": "1"},
            "extra_args": ["--api-key", "k", "--x", 1],
            "max_num_batched_tokens": 256,
        }
    }
    out = redact_mapping(spec)
    assert out == {
        "engine": {
            "env": {"HF_TOKEN": "***", "X": "1"},
            "extra_args": ["--api-key", "***", "--x", "1"],
            "max_num_batched_tokens": 256,
        }
    }


def test_a_variable_name_and_an_unset_value_are_not_hidden():
    """``engine.api_key_env`` names the variable holding the key (shown); an unset secret is null."""
    assert not is_secret_name("api_key_env") and is_secret_name("api_key")
    out = flatten_params({"engine": {"api_key_env": "MY_KEY", "api_key": None, "hf_token": "x"}})
    assert out == {"engine.api_key_env": "MY_KEY", "engine.api_key": "null", "engine.hf_token": "***"}
    assert redact_mapping({"api_key": None, "token": "abc"}) == {"api_key": None, "token": "***"}
    assert redact_override("engine.api_key_env=MY_KEY") == "engine.api_key_env=MY_KEY"


def test_a_urls_password_is_hidden_in_text():
    """A tracking URI such as https://user:password@host carries a password: hidden, the rest kept."""
    assert redact_text("at https://bob:pw12345@mlflow.example:5000/x") == "at https://bob:***@mlflow.example:5000/x"
    assert redact_text("postgresql://bob:s3cr@t@db/x") == "postgresql://bob:***@db/x"
    for plain in (
        "http://127.0.0.1:5000/#/experiments/1",
        "sqlite:////tmp/mlflow.db",
        "https://bob@host/",
        "a http://h:1/x@y",
    ):
        assert redact_text(plain) == plain
    assert redact_override("tracking.uri=https://u:pass@h") == "tracking.uri=https://u:***@h"


def test_secret_values_and_scrub_file(tmp_path):
    """The values under secret-named keys and of secret-named overrides are found and hidden in a
    file somebody else wrote; a boolean, a short value and the other keys are left as they are."""
    data = {"engine": {"env": {"HF_TOKEN": "hfvalue999", "X": "1"}, "use_token": True, "api_key": "abc"}}
    found = secret_values([["+engine.env.VLLM_API_KEY=sk_long_key_1", "engine.max_num_seqs=8"], data])
    assert found == {"hfvalue999", "sk_long_key_1", "abc"}
    f = tmp_path / "multirun.yaml"
    f.write_text(
        "env:\n  HF_TOKEN: hfvalue999\n  X: '1'\nuse_token: true\napi_key: abc\n"
        "- +engine.env.VLLM_API_KEY=sk_long_key_1\nmax_num_seqs: 8\ntok: hf_abcdefghijkl\n"
    )
    scrub_file(f, found)
    assert f.read_text() == (
        "env:\n  HF_TOKEN: ***\n  X: '1'\nuse_token: true\napi_key: abc\n"
        "- +engine.env.VLLM_API_KEY=***\nmax_num_seqs: 8\ntok: ***\n"
    )
    scrub_file(tmp_path / "missing.yaml", found)
    assert not (tmp_path / "missing.yaml").exists()


def test_scrub_file_keeps_bytes_that_are_not_utf8_and_reads_in_blocks(tmp_path):
    """A server KILLed mid-write leaves a cut character: the log is scrubbed anyway (it had raised
    UnicodeDecodeError, which replaced the trial's result), its other bytes as they were; read in
    blocks of whole lines, a secret on a block's edge is hidden too; nothing is left beside it."""
    log = tmp_path / "server.live.log"
    lines = [f"line {i} with some padding to cross blocks\n".encode() for i in range(200)]
    lines[57] = b"non-default args: {'api_key': ['argvkey5678']}\n"
    lines[120] = b"a cut character \xe2\x82 then argvkey5678\n"
    log.write_bytes(b"".join(lines))
    scrub_file(log, {"argvkey5678"}, block_bytes=64)
    out = log.read_bytes()
    assert b"argvkey5678" not in out and out.count(b"***") == 2
    assert b"a cut character \xe2\x82 then ***\n" in out and out.startswith(b"line 0 with")
    assert len(out.splitlines()) == 200 and [p.name for p in tmp_path.iterdir()] == ["server.live.log"]


def test_secrets_inside_a_list_or_dict_override_are_hidden():
    """engine.extra_args=[--api-key, X] and engine.env={HF_TOKEN: X} carry secrets in an override's
    value: the value after a secret flag, a secret flag's =value and a secret key's value are
    hidden, everything else kept as written."""
    assert (
        redact_override("engine.extra_args=['--api-key','argvsecret42','--hf-token=hfsec123x','--x',1]")
        == "engine.extra_args=['--api-key','***','--hf-token=***','--x',1]"
    )
    assert redact_override("engine.env={HF_TOKEN:X1234,Y:2}") == "engine.env={HF_TOKEN:***,Y:2}"
    assert redact_override("engine.extra_args=[--max-num-seqs,8]") == "engine.extra_args=[--max-num-seqs,8]"
    assert is_secret_name("WANDB_KEY") and is_secret_name("private_key") and not is_secret_name("keyfile")
    assert secret_values({"extra_args": ["--api-key", "argvsecret42", "--hf-token=hfsec123x", "--x", 1]}) == {
        "argvsecret42",
        "hfsec123x",
    }
    assert secret_values({"HF_TOKEN": ["v1234", "w5678"]}) == {"v1234", "w5678"}


def test_an_endpoint_does_not_show_its_api_key():
    from orchestrator.loadgen.api import Endpoint

    shown = repr(Endpoint("http://127.0.0.1:1", "m", api_key="sk_live_key_123"))
    assert "sk_live_key_123" not in shown and "http://127.0.0.1:1" in shown


def test_a_config_error_does_not_echo_a_secret_override(compose):
    """The error that lists a bad job's overrides hides a token given among them."""

    from orchestrator.config import ConfigError
    from orchestrator.config.convert import config_to_dict
    from orchestrator.scheduling.jobs import prepare_jobs

    overrides = ["+engine.env.HF_TOKEN=topsecret123", "engine.max_num_seqs=0"]
    with pytest.raises(ConfigError) as err:
        prepare_jobs([(overrides, config_to_dict(compose(overrides)))])
    assert "+engine.env.HF_TOKEN=***" in str(err.value) and "topsecret123" not in str(err.value)


def test_a_trials_error_and_server_log_hide_what_it_knows_to_be_secret(compose, tmp_path, monkeypatch):
    """A server or lm-eval echoing a secret into the error or its log (wherever the trial's result
    goes: result.json, error.txt, the MLflow error tag, the progress line) shows *** instead."""
    from orchestrator.config import to_specs
    from orchestrator.config.convert import config_to_dict
    from orchestrator.config.errors import TrialError
    from orchestrator.trial.run import TrialRun, outcome

    monkeypatch.setenv("MY_SERVER_KEY", "serverkey9876")
    overrides = ["+engine.env.HF_TOKEN=plaintoken1234", "engine.api_key_env=MY_SERVER_KEY"]
    spec, _ = to_specs(config_to_dict(compose(overrides)))
    said: list[str] = []
    run = TrialRun(spec, tmp_path, overrides, [], said.append)
    (tmp_path / "server.log").write_text("loaded with token plaintoken1234 and key serverkey9876\n")
    run.server_logs.append(("server", tmp_path / "server.log"))

    def body() -> None:
        raise TrialError("server said: bad token plaintoken1234 (key serverkey9876)")

    result = outcome(run, body)
    assert result.status == "FAILED"
    for text in (result.error or "", result.server_log, *said):
        assert "plaintoken1234" not in text and "serverkey9876" not in text, text
    assert "bad token *** (key ***)" in (result.error or "")
    assert "token *** and key ***" in result.server_log


def test_the_raw_logs_left_in_a_trials_folder_lose_its_secrets_once_it_ends(compose, tmp_path, monkeypatch):
    """vLLM echoes its argv into its log ("non-default args: {'api_key': [...]}"): once the trial's
    servers are stopped, on every way out (here Ctrl-C), the raw logs in its folder (the servers',
    lm-eval's) show *** where the trial's secrets were."""
    from orchestrator.config import to_specs
    from orchestrator.config.convert import config_to_dict
    from orchestrator.trial.run import TrialRun, run_trial

    overrides = ["engine.extra_args=[--api-key,argvkey5678]"]
    spec, _ = to_specs(config_to_dict(compose(overrides)))

    def measure(self: TrialRun, shared: object = None) -> None:
        log = self.workdir / "server.live.log"
        log.write_text("non-default args: {'api_key': ['argvkey5678']}\n")
        self.server_logs.append(("server", log))
        (self.workdir / "eval.log").write_text("key argvkey5678\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(TrialRun, "measure", measure)
    with pytest.raises(KeyboardInterrupt):
        run_trial(spec, tmp_path, overrides, progress=lambda _: None)
    assert (tmp_path / "server.live.log").read_text() == "non-default args: {'api_key': ['***']}\n"
    assert (tmp_path / "eval.log").read_text() == "key ***\n"


def test_a_shared_servers_raw_log_is_scrubbed_after_its_last_lines(compose, tmp_path, monkeypatch):
    """Trials sharing one server start: its raw log is scrubbed once the servers have stopped, so
    what they write while stopping (vLLM's shutdown lines) is scrubbed too."""
    from orchestrator.config import to_specs
    from orchestrator.config.convert import config_to_dict
    from orchestrator.trial import run_trial_group
    from orchestrator.trial.run import TrialRun

    overrides = ["engine.extra_args=[--api-key,argvkey5678]"]
    spec, _ = to_specs(config_to_dict(compose(overrides)))

    def start_shared(self: TrialRun, stack) -> object:
        log = self.workdir / "server.live.log"
        log.write_text("args: argvkey5678\n")
        self.server_logs.append(("server", log))

        def stop() -> None:  # the server's last lines, written as it stops
            with log.open("a") as f:
                f.write("shutting down argvkey5678\n")

        stack.callback(stop)
        return object()

    monkeypatch.setattr(TrialRun, "start_shared", start_shared)
    monkeypatch.setattr(TrialRun, "measure", lambda self, shared=None: None)
    (result,) = run_trial_group([(spec, tmp_path, overrides)], progress=lambda _: None)
    assert result.status == "FINISHED"
    assert (tmp_path / "server.live.log").read_text() == "args: ***\nshutting down ***\n"


def test_values_hydra_reads_as_one_are_hidden_whole():
    """Hydra takes `a b c` and `abc\\:def` (an escaped colon) as one value: hidden whole (the
    words after the first space and the text after the colon were shown); a secret named in a
    file is hidden where it stands as a word, not inside another ("test" leaves "pytest")."""
    assert redact_override(r"+engine.env={HF_TOKEN:abc-def\:ghi9}") == "+engine.env={HF_TOKEN:***}"
    assert redact_override("engine.extra_args=[--api-key,a b c]") == "engine.extra_args=[--api-key,***]"
    assert redact_override(r"engine.env={HF_TOKEN:a\,b, X: 1}") == "engine.env={HF_TOKEN:***, X: 1}"
    assert secret_values([r"+engine.env={HF_TOKEN:abc-def\:ghi9}", "engine.extra_args=[--api-key,a b c]"]) == {
        r"abc-def\:ghi9",
        "a b c",
    }
    assert hide("pytest ran; key test sent", {"test"}) == "pytest ran; key *** sent"
