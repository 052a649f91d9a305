"""The config tree: every shipped file loads; bad files are reported whole, by path, then refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rlsched.config import JobConfig, TrainerConfig, load_config
from rlsched.errors import UserError
from rlsched.model.template import load_template
from rlsched.rl.sharding import refuse_if_it_does_not_fit

ROOT = Path(__file__).resolve().parents[2]
JOB_FILES = sorted((ROOT / "configs" / "jobs").glob("*.yaml"))
TEMPLATE_FILES = sorted((ROOT / "configs" / "templates").glob("*.json"))
TASK_FILES = sorted((ROOT / "configs" / "tasks").glob("*.jsonl"))
CHAT_TEMPLATE_FILES = sorted((ROOT / "configs" / "chat_templates").glob("*.jinja"))
TOOL_FILES = sorted((ROOT / "configs" / "tools").glob("*.py"))
ALL_SCENARIOS = sorted((ROOT / "configs" / "scenarios").glob("*.yaml"))
CLUSTER_SCENARIOS = [p for p in ALL_SCENARIOS if "\nkind: cluster" in "\n" + p.read_text()]
SCENARIO_FILES = [p for p in ALL_SCENARIOS if p not in CLUSTER_SCENARIOS]
SCENARIO_DATA = sorted((ROOT / "configs" / "scenarios" / "data").glob("*"))
ADMIN_FILES = sorted((ROOT / "configs" / "admin").glob("*.yaml"))
ALL_CONFIG_FILES = sorted(p for p in (ROOT / "configs").rglob("*") if p.is_file())


def test_every_file_under_configs_is_covered_by_a_loader() -> None:
    loaders = set(JOB_FILES) | set(TEMPLATE_FILES) | set(TASK_FILES) | set(ALL_SCENARIOS) | set(ADMIN_FILES)
    loaders |= set(CHAT_TEMPLATE_FILES) | set(TOOL_FILES)
    assert set(ALL_CONFIG_FILES) == loaders | set(SCENARIO_DATA)


def test_every_tool_program_is_a_shipped_jobs_tool_and_compiles() -> None:
    named = {
        (ROOT / str(tool.program_file)).resolve()
        for path in JOB_FILES
        for tool in load_config(path).agent.tools
        if tool.program_file is not None
    }
    assert {p.resolve() for p in TOOL_FILES} <= named
    for path in TOOL_FILES:
        compile(path.read_text(), str(path), "exec")


def test_every_scenario_data_file_is_read_by_a_shipped_scenario() -> None:
    from rlsched.sim.scenario import load_scenario

    used = {
        (path.parent / dist["file"]).resolve()
        for path in SCENARIO_FILES
        for job in load_scenario(path).model_dump()["jobs"]
        for dist in job.values()
        if isinstance(dist, dict) and dist.get("kind") == "empirical" and dist.get("file")
    }
    assert set(SCENARIO_DATA) <= used


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.name)
def test_scenario_files_load(path: Path) -> None:
    from rlsched.sim.scenario import load_scenario

    scenario = load_scenario(path)
    assert scenario.jobs and all(job.iterations >= 1 for job in scenario.jobs)


@pytest.mark.parametrize("path", CLUSTER_SCENARIOS, ids=lambda p: p.name)
def test_cluster_scenario_files_load(path: Path) -> None:
    from rlsched.sim.cluster_scenario import load_cluster_scenario

    scenario = load_cluster_scenario(path)
    assert scenario.streams or scenario.trace is not None


@pytest.mark.parametrize("path", ADMIN_FILES, ids=lambda p: p.name)
def test_admin_files_load(path: Path) -> None:
    from rlsched.admin import describe, load_admin

    assert describe(load_admin(path))


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: p.name)
def test_task_files_load(path: Path) -> None:
    from rlsched.rl.task import JsonlTask

    assert JsonlTask(path, eval_size=10, seed=0).eval_problems


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.name)
def test_job_files_load(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, JobConfig)
    from rlsched.rl.tasks import build_task

    assert build_task(cfg.task).eval_problems  # the task the job names loads too


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=lambda p: p.name)
def test_template_files_load(path: Path) -> None:
    assert load_template(str(path)).name == path.stem


def test_defaults_come_from_code_and_yaml_only_overrides(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("grpo:\n  lr: 0.001\n")
    cfg = load_config(f)
    assert cfg.grpo.lr == 0.001
    assert cfg.grpo.group_size == JobConfig().grpo.group_size


def test_set_overrides_parse_scalars() -> None:
    cfg = load_config(
        None, ["grpo.steps=7", "engine.use_cache=false", "sampling.temperature=0.5", "run.out_dir=/tmp/x"]
    )
    assert (cfg.grpo.steps, cfg.engine.use_cache, cfg.sampling.temperature) == (7, False, 0.5)
    assert str(cfg.run.out_dir) == "/tmp/x"


def test_config_is_frozen() -> None:
    cfg = load_config(None)
    with pytest.raises(ValidationError):
        cfg.grpo.lr = 1.0  # type: ignore[misc]


def test_all_errors_reported_together_with_paths(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("grpo:\n  lr: fast\n  group_sise: 4\nsampling:\n  top_p: 2\nbogus: 1\n")
    with pytest.raises(UserError) as info:
        load_config(f)
    msg = str(info.value)
    assert "4 problem(s)" in msg
    for path in ("grpo.lr", "grpo.group_sise", "sampling.top_p", "bogus"):
        assert path in msg
    assert "group_size" in msg  # the valid keys are listed next to the misspelt one


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "broken.yaml"
    f.write_text("grpo:\n  lr: 0.1\n   steps: [1, 2\n")
    with pytest.raises(UserError, match=r"not valid YAML at line \d+"):
        load_config(f)


@pytest.mark.parametrize("text", ["- a\n- b\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    f = tmp_path / "list.yaml"
    f.write_text(text)
    with pytest.raises(UserError, match="mapping"):
        load_config(f)


def test_missing_file_and_bad_set() -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_config("/nonexistent/job.yaml")
    with pytest.raises(UserError, match="KEY=VALUE"):
        load_config(None, ["grpo.lr"])
    with pytest.raises(UserError, match="unknown key"):
        load_config(None, ["grpo.nope=1"])


def test_cross_field_rule() -> None:
    with pytest.raises(UserError, match="curve_size"):
        load_config(None, ["task.eval_size=100", "eval.curve_size=200"])


def test_the_admin_file_becomes_the_admission_policys_parameters() -> None:
    from rlsched.admin import admission_params, load_admin

    p = admission_params(load_admin(ROOT / "configs/admin/example.yaml"))
    assert p.classes["training"].grace_s == 30 and p.classes["online"].preemptible is False
    assert p.queues["team-a"].borrowing_limit == {"H100": 2} and p.queues["team-b"].lending_limit == {
        "A100": 8
    }
    assert p.queues["serving"].cohort is None and p.queues["serving"].borrowing_limit is None
    assert p.reserve == {"H100": 1, "CPU": 8} and p.reserve_classes == {"online"}
    assert p.drf and p.usage_half_life_s == 3600 and p.device_types == {"H100", "A100"}
    assert p.borrow_within_cohort and p.never_below_nominal


def test_the_quickstart_config_sets_only_what_differs_from_the_code_defaults() -> None:
    import yaml

    from rlsched.config import load_config

    tree = yaml.safe_load(Path("configs/jobs/quickstart.yaml").read_text())
    defaults = load_config(None).model_dump(mode="json")
    restated = [f"{s}.{k}" for s, keys in tree.items() for k, v in keys.items() if defaults[s][k] == v]
    assert restated == [], f"configs/jobs/quickstart.yaml restates code defaults: {restated}"


def test_trainer_offload_is_refused_where_it_means_nothing() -> None:
    with pytest.raises(ValueError, match=r"set trainer\.strategy=fsdp"):
        TrainerConfig(offload=True, gpus_per_rank=1)
    with pytest.raises(ValueError, match="have no GPU"):
        TrainerConfig(strategy="fsdp", offload=True)
    assert TrainerConfig(strategy="fsdp", offload=True, gpus_per_rank=1).offload


def test_a_training_state_that_does_not_fit_is_refused_with_the_numbers() -> None:
    params, gib = 1_000_000_000, 1 << 30  # 16 GB of state for a replica, 8 GB a rank under fsdp at N=2
    replica = TrainerConfig(ranks=2, placement_strategy="PACK")
    with pytest.raises(
        UserError, match=r"1000.0M parameters x 16 bytes \(a full replica\) = 14.90 GiB per rank"
    ):
        refuse_if_it_does_not_fit(params, replica, 12 * gib, "the GPU (H200)")
    sharded = TrainerConfig(ranks=2, strategy="fsdp", placement_strategy="PACK")
    refuse_if_it_does_not_fit(params, sharded, 12 * gib, "the GPU (H200)")  # 7.45 GiB fits
    packed = TrainerConfig(ranks=2, strategy="fsdp")  # STRICT_PACK: both ranks in one host's memory
    with pytest.raises(
        UserError, match=r"7.45 GiB per rank x 2 ranks on one node, but host memory has 12.00"
    ):
        refuse_if_it_does_not_fit(params, packed, 12 * gib, "host memory")


def test_relays_with_an_upload_of_zero_are_refused_and_an_unset_upload_is_the_receivers() -> None:
    with pytest.raises(UserError, match=r"upload_gbps is 0: a receiver that cannot upload.*relay: false"):
        load_config(None, ["weights.relay=true", "weights.upload_gbps=0"])
    relay = load_config(None, ["weights.relay=true", "weights.receiver_gbps=2"]).weights.relay_params()
    assert relay is not None and relay.upload_bps == 2e9 and relay.egress_bps == 10e9  # unshaped egress
    assert load_config(None, ["weights.upload_gbps=0"]).weights.relay_params() is None  # relays off


@pytest.mark.parametrize("path", CHAT_TEMPLATE_FILES, ids=lambda p: p.name)
def test_chat_templates_render_tools_and_calls(path: Path) -> None:
    """Each shipped Jinja chat template compiles as transformers compiles it, lists the tools it is
    given, and writes an assistant's calls back as `<tool_call>` blocks."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    template = _compile_jinja_template(path.read_text())
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    call = {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "r"},
    ]
    text = template.render(messages=messages, tools=[tool], add_generation_prompt=True)
    assert '{"name": "f", "parameters": {"type": "object"}}' in text
    assert '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>' in text
    assert "<tool_response>\nr\n</tool_response>" in text
