"""Run by tests/lang/test_sglang_client.py in a throw-away venv that holds the real `sglang`
wheel: SGLang's own, unmodified frontend client drives a radixrt server given as argv[1].
Prints one JSON object of results (the test asserts on them)."""

import json
import sys

import sglang as sgl


@sgl.function
def few_shot(s, question):
    s += "Q: What is the capital of France?\nA: Paris\n"
    s += "Q: What is the capital of Germany?\nA: Berlin\n"
    s += "Q: " + question + "\n"
    s += "A:" + sgl.gen("answer", stop="\n", temperature=0, max_tokens=6)


@sgl.function
def pick(s, statement):
    s += "Statement: The capital of France is Paris.\nAnswer: True\n"
    s += "Statement: " + statement + "\nAnswer:" + sgl.select("answer", ["True", "False"])


@sgl.function
def typed(s):
    s += "The number of hours in a day is " + sgl.gen_int("hours", max_tokens=4) + "\n"
    s += "A: " + sgl.gen("ip", regex=r"[0-9]{1,3}\.[0-9]{1,3}", temperature=0, max_tokens=8)


@sgl.function
def forked(s):
    s += "Here are two colors:\n"
    forks = s.fork(2)
    for i in range(2):
        forks[i] += f"{i + 1}." + sgl.gen("color", max_tokens=4, stop="\n", temperature=0)
    forks.join()


@sgl.function
def encoded(s):
    s += "Facts:\n"
    forks = s.fork(2)
    forks += lambda i: f"Fact {i}: item {i}.\n"
    forks.join(mode="concate_and_append")  # SGLang's client asks the server to splice KV
    s += "Summary:" + sgl.gen("summary", max_tokens=4, temperature=0)


@sgl.function
def chat(s, question):
    s += sgl.user(question)
    # 48 tokens without EOS: the client joins whatever arrived while its reader thread slept,
    # so a short answer on a busy machine can come as one chunk (seen in CI with 12).
    s += sgl.assistant(sgl.gen("answer", max_tokens=48, temperature=0, ignore_eos=True))


def main(url: str) -> None:
    backend = sgl.RuntimeEndpoint(url)
    sgl.set_default_backend(backend)
    out = {
        "model_name": backend.get_model_name(),
        "server_info_keys": sorted(backend.get_server_info()),
    }
    backend.flush_cache()
    out["answer"] = few_shot.run(question="What is the capital of Italy?")["answer"]
    batch = few_shot.run_batch(
        [
            {"question": "What is the capital of Spain?"},
            {"question": "What is the capital of Japan?"},
        ]
    )
    out["batch"] = [state["answer"] for state in batch]
    out["select"] = pick.run(statement="The capital of Germany is Berlin.")["answer"]
    state = typed.run(temperature=0)
    out["hours"], out["ip"] = state["hours"], state["ip"]
    out["colors"] = forked.run()["color"]
    out["encoded_text"] = encoded.run().text()
    stream = chat.run(question="Say hello.", stream=True)
    out["stream_chunks"] = list(stream.text_iter("answer"))
    out["chat_text"] = stream.text()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
