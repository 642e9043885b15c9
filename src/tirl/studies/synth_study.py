"""`tirl study synth`: do AgentMath's synthesis stages add accuracy? With a real teacher, on CPU.

AgentMath (papers/002) synthesizes tool-integrated trajectories from a teacher's chains of
thought (code-ify, format, execute, self-correct, replace outputs, judge, limit code, check the
answer) and claims that SFT on them, then RL, beats what the model reaches without them. Here,
at the scale of one CPU machine:

1. Problems: real word problems and arithmetic from reasoning-gym (`study.sources`, through
   tirl's `reasoning_gym` task source): its question is the problem (the line asking for an
   `<answer>` tag dropped: here answers are `\\boxed{}`), its answer the reference. Train items
   are synthesized and trained on; held-out items come from the test split (a question goes to
   one split by its hash, so the two never share one). Written to `problems/`.
2. Synthesis: `tirl serve` of the teacher (`teacher.model`) as a child process on a free
   loopback port, which dies with the study (`tirl.lifetime`) and is stopped once synthesis is
   done. The `cot` stage gives each problem a chain of thought: with `study.cot: dataset`
   (AgentMath's way, rewriting existing CoT data) its dataset's worked solution where it has
   one (gsm_symbolic's), the teacher's own otherwise; with `teacher`, the teacher's own always.
   Then `tirl synth`'s stages run over them (`tirl.synth.pipeline`, in
   `synth/`, resumable by its request caches and stage files). Each stage's pass rate and wall
   time are recorded (`synth/stage_times.json`).
3. Three arms from the same base model, each then trained by the same RL (`run.rl`) and
   evaluated on the same held-out items (greedy): `synth` (SFT on the trajectories that passed
   every stage, all of them), `scripted` (SFT on tirl's teacher-free demonstrations of
   `study.scripted_source`, every one using the interpreter, as many as the synth arm got, or
   `study.scripted_examples`), `none` (no SFT). Each arm is a pipeline run folder in `arms/`;
   an arm whose run would be an earlier arm's exactly (no trajectory passed, so the synth arm
   has no SFT, like `none`) is that run, copied and marked `same_as`, not trained again.
4. The analysis and report (`tirl.studies.synth_report`, which the command hands in).

Resuming (`resume`): the problems are rewritten the same (seeded), the teacher's answers come
from the caches, finished synthesis stages are not rerun, and each arm's pipeline resumes
(`Pipeline(resume=True)`: finished SFT, RL and evaluations are loaded). The config must be the
one the folder was started with.
"""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tirl.config import ConfigError, dump_yaml, load_config, to_dict
from tirl.files import read_jsonl, write_text
from tirl.lifetime import dies_with_this_process
from tirl.run.build import sandbox_for
from tirl.run.config import RunConfig, SFTStage
from tirl.run.evaluation import Evaluation
from tirl.studies.synth_config import (
    SynthStudyConfig,
    TeacherSettings,
    problem_sources,
    write_problems,
)
from tirl.synth.config import EndpointConfig, SynthConfig
from tirl.train.pipeline import Pipeline, flat_keys, quiet_transformers, seed_everything
from tirl.train.run_folder import claim_folder

StudyReport = Callable[[Path], dict]  # (study folder) -> results; tirl.studies.synth_report's

ARMS = ("synth", "scripted", "none")
VARIANT = "code"  # every arm may call the interpreter
EVAL_SET = "heldout"
STUDY_ENTRIES: tuple[str, ...] = (
    r"config\.yaml",
    r"problems",
    r"cot",
    r"synth",
    r"arms",
    r"training",
    r"results\.json",
    r"study\.md",
    r"report\.html",
    r"timings\.json",
)
COT_SYSTEM = (
    "Solve the math problem step by step. Show your reasoning, then give the final answer as"
    " \\boxed{...}."
)
# ------------------------------------------------------------------------------ the teacher


class ServedTeacher:
    """`tirl serve MODEL --port 0` as a child process that dies with this one; `url` once up."""

    def __init__(self, t: TeacherSettings, log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("a", encoding="utf-8")
        cmd = [sys.executable, "-m", "tirl.cli", "serve", t.model, "--port", "0",
               "--max-batch", str(t.max_batch), "--threads", str(t.threads)]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            preexec_fn=dies_with_this_process(),
        )
        self.url = self._wait_for_url(t.start_timeout_s, log_path)

    def _wait_for_url(self, timeout_s: float, log_path: Path) -> str:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                line = self.proc.stdout.readline()
                if "listening on" in line:
                    # the rest of its output goes to the log, so a full pipe never blocks it
                    threading.Thread(target=self._drain, daemon=True).start()
                    return line.strip().rsplit(" ", 1)[1]
                if not line:  # the server exited
                    break
        self.close()
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"teacher.model: tirl serve did not start ({tail[0]}; log: {log_path})")

    def _drain(self) -> None:
        for line in self.proc.stdout:
            if not self._log.closed:
                self._log.write(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def endpoint(t: TeacherSettings, url: str, max_tokens: int) -> EndpointConfig:
    return EndpointConfig(
        url=url,
        concurrency=t.concurrency,
        temperature=t.temperature,
        max_tokens=max_tokens,
        timeout_s=t.timeout_s,
    )


def synth_config(cfg: SynthStudyConfig, url: str) -> SynthConfig:
    """`tirl synth`'s config: the study's stages and limits, the served teacher (also the
    judge), the trajectories in the run's protocol, tools and sandbox output limit."""
    t = cfg.teacher
    out = SynthConfig(
        stages=cfg.stages,
        limits=cfg.limits,
        teacher=endpoint(t, url, t.max_tokens),
        output_format=cfg.run.protocol.name,
        tools=list(cfg.run.tools),  # the tools the student is trained with
        concurrency=t.concurrency,
        codeify_examples=t.codeify_examples,
    )
    out.input.skip_bad_records = True  # an empty chain of thought is counted, not fatal
    out.sandbox.max_output_chars = cfg.run.sandbox.max_output_chars
    out.validate()
    return out


async def chains_of_thought(
    t: TeacherSettings, url: str, rows: list[dict], cache: Path, from_dataset: bool
) -> list[dict]:
    """A chain of thought per problem: its `worked` solution if `from_dataset` and it has one,
    else the teacher's (cached by request: a resume asks nothing again); rows with `solution`,
    `cot_from` ("dataset" or "teacher") and `cot_correct` (its boxed answer verified) added."""
    from tirl.rewards.answer import extract_boxed
    from tirl.rewards.verify import default_verifier
    from tirl.synth.client import ChatClient

    client = ChatClient(endpoint(t, url, t.cot_max_tokens), cache)
    verifier = default_verifier()

    async def one(row: dict) -> dict:
        if from_dataset and row.get("worked"):
            text, origin = row["worked"], "dataset"
        else:
            messages = [{"role": "system", "content": COT_SYSTEM},
                        {"role": "user", "content": row["problem"]}]  # fmt: skip
            text, origin = await client.chat(messages), "teacher"
        verdict = await verifier.averify(row["answer"], extract_boxed(text))
        return {**row, "solution": text, "cot_from": origin, "cot_correct": bool(verdict.correct)}

    try:
        return list(await asyncio.gather(*(one(r) for r in rows)))
    finally:
        await client.aclose()


def synthesize(cfg: SynthStudyConfig, out: Path, train_path: Path) -> None:
    """The `cot` stage, then `tirl synth`'s stages, against the served teacher. A finished
    `cot` stage (`cot/stage.json`, with the wall time of the run that finished it) is read
    back, a finished synthesis (`synth/trajectories.jsonl` too) starts no teacher at all."""
    from tirl.synth.pipeline import run_pipeline

    synth_dir, cot_dir = out / "synth", out / "cot"
    stage_path = cot_dir / "stage.json"
    if (synth_dir / "trajectories.jsonl").exists() and stage_path.exists():
        return
    teacher = ServedTeacher(cfg.teacher, cot_dir / "server.log")
    try:
        if not stage_path.exists():
            start = time.perf_counter()
            rows = list(read_jsonl(train_path))
            from_dataset = cfg.study.cot == "dataset"
            done = asyncio.run(
                chains_of_thought(
                    cfg.teacher, teacher.url, rows, cot_dir / "cache.jsonl", from_dataset
                )
            )
            write_text(cot_dir / "input.jsonl", "".join(json.dumps(r) + "\n" for r in done))
            stage = {"items": len(done), "correct": sum(r["cot_correct"] for r in done),
                     "answered": sum(bool(r["solution"].strip()) for r in done),
                     "from_dataset": sum(r["cot_from"] == "dataset" for r in done),
                     "seconds": round(time.perf_counter() - start, 3)}  # fmt: skip
            write_text(stage_path, json.dumps(stage, indent=2))
        resume = (synth_dir / "stages").is_dir()
        run_pipeline(
            synth_config(cfg, teacher.url), str(cot_dir / "input.jsonl"), synth_dir, resume
        )
    finally:
        teacher.close()


# ------------------------------------------------------------------------------ the arms


def synthesized_count(out: Path) -> int:
    path = out / "synth" / "trajectories.jsonl"
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def sft_examples(cfg: SynthStudyConfig, out: Path) -> dict[str, int]:
    """Demonstrations per arm: the synth arm every trajectory that passed, the scripted arm as
    many (or `study.scripted_examples`), none none."""
    n = synthesized_count(out)
    return {"synth": n, "scripted": cfg.study.scripted_examples or n, "none": 0}


def arm_config(cfg: SynthStudyConfig, paths: dict[str, Path], arm: str, n: int) -> RunConfig:
    """One arm's run: RL on the train problems and evaluation on the held-out ones (the
    `dataset` source, scored by `\\boxed{}`), SFT as the arm has it."""
    run = cfg.run
    train = {"source": "dataset", "path": str(paths["train"]), "test_share": 0.0}
    heldout = {"name": EVAL_SET, "items": cfg.study.heldout_items, "source": "dataset",
               "path": str(paths["heldout"]), "test_share": 1.0}  # fmt: skip
    data = replace(run.data, train=[train], eval=[heldout])
    sft = replace(run.sft, steps=0, data=None, stages=[])
    if arm == "synth" and n:
        sft = replace(run.sft, data=str(paths["trajectories"]), examples=n, stages=[])
    elif arm == "scripted" and n:
        stage = SFTStage(steps=run.sft.steps, data=[dict(cfg.study.scripted_source)], examples=n)
        sft = replace(run.sft, stages=[stage], code_share=1.0, data=None)
    return replace(run, variants=[VARIANT], data=data, sft=sft)


async def _train_arms(cfg: SynthStudyConfig, out: Path, evaluation: Evaluation, resume: bool):
    paths = {"train": out / "problems" / "train.jsonl",
             "heldout": out / "problems" / "heldout.jsonl",
             "trajectories": out / "synth" / "trajectories.jsonl"}  # fmt: skip
    counts = sft_examples(cfg, out)
    tokenizer = None
    trained: dict[str, str] = {}  # an arm's config (as YAML text) -> the arm that trained it
    async with sandbox_for(cfg.run) as sandbox:
        for arm in ARMS:
            arm_cfg = arm_config(cfg, paths, arm, counts[arm])
            arm_cfg.validate()  # the files it names exist now
            run_dir = out / "arms" / arm
            key = json.dumps(to_dict(arm_cfg), sort_keys=True)
            if key in trained:  # no demonstrations: the same run as an earlier arm's, not redone
                same_as(out / "arms" / trained[key], run_dir, counts[arm])
                continue
            trained[key] = arm
            if _copied(run_dir):  # a copy from before (its config was another arm's then)
                shutil.rmtree(run_dir)
            dump_yaml(arm_cfg, _mkdir(run_dir) / "config.yaml")
            pipeline = Pipeline(arm_cfg, run_dir, evaluation, resume=resume)
            pipeline.prepare(tokenizer)
            tokenizer = pipeline.tokenizer  # one tokenizer for every arm (the tiny model's)
            seed_everything(arm_cfg.seed)
            model = pipeline.make_model()
            start = time.perf_counter()
            try:
                await pipeline.sft(VARIANT, model, sandbox, True)
                if arm_cfg.rl.steps > 0:
                    await pipeline.rl(VARIANT, model, sandbox, True, arm_cfg)
            finally:
                pipeline.logger.close()
            wall = _prior_wall(run_dir) + time.perf_counter() - start
            results = {**pipeline.results, "wall_s": wall, "sft_examples": counts[arm]}
            write_text(run_dir / "eval.json", json.dumps(results, indent=2))
            del model, pipeline
            gc.collect()


def same_as(source: Path, run_dir: Path, examples: int) -> None:
    """An arm whose run is `source`'s exactly (both had no demonstrations, so neither had SFT):
    its evaluations and training log, copied, and `same_as` naming the arm in its eval.json."""
    done = run_dir / "eval.json"
    if done.exists() and json.loads(done.read_text()).get("same_as") == source.name:
        return  # copied by the run before this resume
    shutil.rmtree(run_dir, ignore_errors=True)
    _mkdir(run_dir / "samples")
    for name in ("config.yaml", "metrics.jsonl", "eval_progress.json"):
        shutil.copyfile(source / name, run_dir / name)
    for path in (source / "samples").glob("*.jsonl"):
        shutil.copyfile(path, run_dir / "samples" / path.name)
    info = json.loads((source / "eval.json").read_text())
    info.update(sft_examples=examples, same_as=source.name, wall_s=0.0)
    write_text(run_dir / "eval.json", json.dumps(info, indent=2))


def _copied(run_dir: Path) -> bool:
    done = run_dir / "eval.json"
    return done.exists() and bool(json.loads(done.read_text()).get("same_as"))


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _prior_wall(run_dir: Path) -> float:
    """Wall time an earlier (killed) run of this arm reported, if it finished its eval.json."""
    path = run_dir / "eval.json"
    return float(json.loads(path.read_text()).get("wall_s", 0.0)) if path.exists() else 0.0


# ------------------------------------------------------------------------------ the study


def check_resume(cfg: SynthStudyConfig, out: Path) -> None:
    saved = out / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"cannot resume {out}: it has no config.yaml (no study started there)")
    old = flat_keys(to_dict(load_config(SynthStudyConfig, saved)))
    new = flat_keys(to_dict(cfg))
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if differ:
        raise ConfigError(
            f"cannot resume {out}: its config.yaml differs in {', '.join(differ[:5])}; resume"
            " with the same config and --quick as it was started with"
        )


def run_study(
    cfg: SynthStudyConfig, out: Path, evaluation: Evaluation, report: StudyReport, resume: bool
) -> dict:
    """Problems, synthesis, the three arms, the report; returns the report's results."""
    out = Path(out)
    problem_sources(cfg)  # a bad source is one line before anything is written
    if cfg.run.sft.stages or cfg.run.sft.data:
        raise ConfigError("run.sft.stages and run.sft.data are set by the study per arm", "run.sft")
    if resume:
        check_resume(cfg, out)
    quiet_transformers(cfg.run)
    timings: dict[str, float] = {}
    with claim_folder(out, "study", STUDY_ENTRIES, resume=resume):
        dump_yaml(cfg, out / "config.yaml")
        start = time.perf_counter()
        paths = write_problems(cfg, out)
        synthesize(cfg, out, paths["train"])
        timings["synthesis_s"] = time.perf_counter() - start
        start = time.perf_counter()
        asyncio.run(_train_arms(cfg, out, evaluation, resume))
        timings["arms_s"] = time.perf_counter() - start
        write_text(out / "timings.json", json.dumps(_add_timings(out, timings), indent=2))
        return report(out)


def _add_timings(out: Path, timings: dict[str, float]) -> dict:
    """This run's wall times, beside those of the runs before it in a resumed folder."""
    path = out / "timings.json"
    runs = json.loads(path.read_text()).get("runs", []) if path.exists() else []
    runs.append({k: round(v, 1) for k, v in timings.items()})
    return {"runs": runs}
