"""``bench llm``: a real model's agent through the platform against the model's server alone.

The local model's server (``manage.py llm_serve``'s, one thread) is started here. The platform side evaluates
the seed of the bundled example's LLM variant (``llm_agent.py``, its first ``tasks`` tasks, k = 1) through a
trial worker of eight thread slots, as ``dev.py run`` starts it, under the endpoint's in-flight limit; its
rate is the tokens the server reported in the trials' steps over the wall time from ``evaluation_start`` to
the certified record. The baseline sends the same requests (each trial's messages, schema, temperature and
seed, rebuilt from its stored trajectory) straight to the same server, with as many in flight as the
endpoint allows, in the same run. One request with the harness's system message goes first, so neither side
pays the server's first read of the prompt they share. The ratio is baseline tokens per second over the
platform's (target 1.10).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from evolution import llm_local
from evolution.models import Evaluation, Experiment, TrajectoryStep, Trial
from evolution.services import evaluation as evaluation_services
from lab.bench import BenchResult, benchmark
from lab.bench.orchestration import wait_certified, with_example_experiment, worker_start
from lab.processes import free_port

SLOTS = 8


def _agent() -> Any:
    """``llm_agent.py`` of the example's evaluator, imported as the trials run it (beside ``agent.py``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "evolution" / "example" / "evaluator"))
    try:
        import llm_agent  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return llm_agent


def _request(trial: Trial, agent: Any) -> dict[str, Any]:
    """The body of the trial's first request, as llm_agent.py built it: its system and user steps, the
    harness's tools as the answer schema, its temperature and the trial's seed."""
    from evolution.example.setup import EXAMPLE_DIR

    harness = agent.load_harness(EXAMPLE_DIR / "harness")
    steps = TrajectoryStep.objects.filter(trajectory__trial=trial, source__in=["system", "user"]).order_by("step_id")
    system, user = (step.message for step in list(steps)[:2])
    return {
        "model": llm_local.MODEL_ALIAS,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "temperature": harness.settings.temperature,
        "seed": trial.seed,
        "max_tokens": agent.MAX_ANSWER_TOKENS,
        "response_format": {"type": "json_object", "schema": agent.answer_schema(harness.tools)},
    }


def _warm(url: str, agent: Any) -> None:
    """One request with the seed harness's system message, so neither side pays the server's first read of
    it: the server keeps the last prompt's prefix, which every trial's request shares."""
    from evolution.example.setup import EXAMPLE_DIR

    system = agent.system_message(agent.load_harness(EXAMPLE_DIR / "harness"))
    _post(url, {"model": llm_local.MODEL_ALIAS, "messages": [{"role": "system", "content": system}], "max_tokens": 1})


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        usage = json.loads(response.read())["usage"]
    return int(usage["prompt_tokens"]) + int(usage["completion_tokens"])


@benchmark(
    "llm",
    "a real model's agent through 8 trial slots vs the same requests sent straight to the model's server",
    quick={"tasks": 4},
)
def llm(*, tasks: int = 16) -> BenchResult:
    port = free_port()
    url = llm_local.base_url(port)
    server = subprocess.Popen(llm_local.server_command(port=port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = {key: os.environ.get(key) for key in ("RSI_LLM_BASE_URL", "RSI_LLM_MODEL", "RSI_TRIAL_TIMEOUT")}
    # The trial worker started below inherits these: the endpoint, and time for a trial to wait its turn there.
    os.environ.update(RSI_LLM_BASE_URL=url, RSI_LLM_MODEL=llm_local.MODEL_ALIAS, RSI_TRIAL_TIMEOUT="600")
    try:
        llm_local.wait_ready(url, timeout=180, alive=lambda: server.poll() is None)
        agent = _agent()
        _warm(url, agent)

        def body(experiment: Experiment, scratch: Path) -> BenchResult:
            seed = experiment.seed_candidate
            assert seed is not None
            worker = worker_start(log_dir=scratch, concurrency=SLOTS, pool="threads")
            try:
                began = time.time()
                evaluation = evaluation_services.evaluation_start(
                    candidate=seed,
                    splits=sorted(experiment.split_digests),
                    k=1,
                    purpose=Evaluation.Purpose.BASELINE,
                )
                certified = wait_certified(evaluation, timeout=120 + 300 * tasks, workers=[worker])
            finally:
                worker.stop()
            trials = list(Trial.objects.filter(evaluation=evaluation).order_by("pk"))
            platform_tokens = sum(trial.tokens or 0 for trial in trials)
            platform_seconds = certified - began
            calls = TrajectoryStep.objects.filter(trajectory__trial__evaluation=evaluation, source="agent").count()
            bodies = [_request(trial, agent) for trial in trials]
            assert experiment.endpoint is not None
            in_flight = experiment.endpoint.max_in_flight
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=in_flight) as pool:
                direct_tokens = sum(pool.map(lambda b: _post(url, b), bodies))
            direct_seconds = time.perf_counter() - start
            platform_rate = platform_tokens / platform_seconds
            direct_rate = direct_tokens / direct_seconds
            return BenchResult(
                ratio=direct_rate / platform_rate,
                target=1.10,
                label="llm: server alone / platform, tokens per second",
                lines=[
                    f"model: {llm_local.MODEL_ALIAS} on llama.cpp's server, 1 thread; {len(trials)} trials "
                    f"({tasks} tasks x k=1), {calls} model calls; {SLOTS} trial slots, at most {in_flight} in flight",
                    f"platform: {platform_tokens} tokens in {platform_seconds:.1f} s = {platform_rate:.1f} tokens/s "
                    f"(evaluation_start to the certified record)",
                    f"direct:   {direct_tokens} tokens in {direct_seconds:.1f} s = {direct_rate:.1f} tokens/s "
                    f"(the trials' first requests, {in_flight} at a time)",
                ],
                # The direct side sends each trial's first request: a like-for-like only when that was its only one.
                checks={
                    "every trial done": all(t.state == Trial.State.DONE for t in trials),
                    "one model call a trial": calls == len(trials),
                },
            )

        return with_example_experiment("llm", tasks, body, agent="llm")
    finally:
        server.terminate()
        server.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for name in ("llm_agent", "agent"):
            sys.modules.pop(name, None)
