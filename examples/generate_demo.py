"""A short generation demo on the default model (the main job until `radixrt launch` lands)."""

import radixrt


def main() -> None:
    llm = radixrt.Engine()
    prompts = ["The capital of France is", "List three colors:", "def fibonacci(n):"]
    outs = llm.generate(prompts, {"temperature": 0, "max_new_tokens": 32})
    for prompt, out in zip(prompts, outs, strict=True):
        meta = out["meta_info"]
        print(
            f"--- {prompt!r}\n{out['text']}\n[{meta['completion_tokens']} tokens, "
            f"finish {meta['finish_reason']}, cached {meta['cached_tokens']}]"
        )
    print("--- streaming, through the model's chat template:")
    messages = [{"role": "user", "content": "Tell me a short story about a robot."}]
    prompt = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for chunk in llm.generate(
        prompt, {"temperature": 0.7, "seed": 1, "max_new_tokens": 64}, stream=True
    ):
        print(chunk["text"], end="", flush=True)
    print()
    llm.shutdown()


if __name__ == "__main__":
    main()
