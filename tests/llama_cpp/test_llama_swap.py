"""More models than cards with the real engine: two llama.cpp models (the tiny GGUF under two
names) on one simulated GPU, requested in turn through gpurouter with the openai client. Each
request finds the other model holding the card, idle, and is answered once it is swapped in."""

from __future__ import annotations

import pytest

from tests.agent.test_agent_sim import FLEET, SimFleet
from tests.harness import call, wait_until
from tests.llama_cpp.test_llama_server import spec_for

pytestmark = pytest.mark.integration
GPU_CLASS = FLEET["fabrics"][0]["gpu_class"]  # the class spec_for gives the model
ONE_GPU = {"fabrics": [{"name": "cpu", "nodes": 1, "gpu_class": GPU_CLASS, "gpus_per_node": 1}]}
NAMES = ("tiny-a", "tiny-b")


def test_two_llama_models_on_one_card_are_swapped_in_turn(llama_build, tiny_llama, procs, tmp_path):
    import openai

    fleet = SimFleet(procs, tmp_path, fleet=ONE_GPU, server_args=("--min-residency", "1s"))
    for name in NAMES:
        spec = {
            **spec_for(llama_build.binary, tiny_llama),
            "name": name,
            "replicas": 1,
            "min_replicas": 0,
            "scale_to_zero_after": "1h",
        }
        call("POST", fleet.url + "/v1/models", spec)
    wait_until(lambda: fleet.replicas("Ready"), timeout=60, what="the first llama-server")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0, timeout=120)
    served = []
    for name in (*NAMES, *NAMES):
        answer = api.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert answer.choices[0].message.content is not None
        assert answer.usage.completion_tokens > 0
        (ready,) = fleet.replicas("Ready")
        assert ready["model"] == name, "one card: only the model asked for runs"
        served.append(name)
    assert served == [*NAMES, *NAMES]
    swaps = call("GET", fleet.url + "/v1/summary")[1]["room"]["swaps_last_hour"]
    assert swaps == 3, "the first model was placed at start; each later request swapped"
