"""`gpuctl sim-engine` answers every endpoint it serves as the official openai client reads it,
streaming and not, through gpurouter (the autoscaling and swap tests lean on it)."""

import openai
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def api(procs):
    engine = procs.engine("m", output_tokens=6, tokens_per_s=200)
    router, _ = procs.router(f"--backend=m={engine}")
    return openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=10)


def test_chat_completions_plain_and_streamed(api):
    answer = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content.split() and answer.usage.completion_tokens == 6
    chunks = list(
        api.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6 and chunks[-1].usage.completion_tokens == 6


def test_completions_plain_and_streamed(api):
    answer = api.completions.create(model="m", prompt="hi", max_tokens=3)
    assert len(answer.choices[0].text.split()) == 3
    chunks = list(api.completions.create(model="m", prompt="hi", max_tokens=3, stream=True))
    assert len("".join(c.choices[0].text for c in chunks).split()) == 3
    assert chunks[-1].choices[0].finish_reason == "length"


def test_responses_plain_streamed_retrieved_and_deleted(api):
    answer = api.responses.create(model="m", input="hi")
    assert answer.output_text and len(answer.output_text.split()) == 6
    assert answer.output[0].role == "assistant" and answer.usage.output_tokens == 6
    stored = api.responses.retrieve(answer.id, extra_query={"model": "m"})
    assert stored.output_text == answer.output_text
    with api.responses.stream(model="m", input="hi", max_output_tokens=4) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and len(final.output_text.split()) == 4
    events = list(api.responses.create(model="m", input="hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    api.responses.delete(answer.id, extra_headers={"X-Gpufleet-Model": "m"})
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(answer.id, extra_query={"model": "m"})


def test_embeddings_models_and_transcriptions(api):
    embedded = api.embeddings.create(model="m", input=["a", "b"])
    assert [d.index for d in embedded.data] == [0, 1] and embedded.data[0].embedding
    assert [m.id for m in api.models.list()] == ["m"]
    heard = api.audio.transcriptions.create(model="m", file=("a.wav", b"x" * 10))
    assert heard.text == "10 bytes of audio heard"
