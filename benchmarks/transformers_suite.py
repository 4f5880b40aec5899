"""A whole model through Hugging Face transformers: one training step (tokens/s) and greedy generation
(ms/token) of a randomly initialised Llama-shaped model (Llama 3.2 1B's shape by default), with each
attention implementation transformers can load here: "fa" (fa.integrations.transformers), "sdpa",
and "flash_attention_2" / "flash_attention_3" where their packages import.

    python benchmarks/transformers_suite.py                    # bf16, batch 4 x 4096 tokens, 512 new tokens
    python benchmarks/transformers_suite.py --impl fa,sdpa --batch 8 --seqlen 2048

One process, one model: the implementations are switched with model.set_attn_implementation and
taken in a new shuffled order in each round, each step timed with CUDA events; the table gives the
median over the rounds. A training step is forward, cross-entropy loss, backward and an AdamW step
on all weights; tokens/s counts the batch's tokens. Generation is model.generate(max_new_tokens=N,
greedy, no end-of-sequence stop) of one prompt, its time over N.
"""

import argparse
import importlib.util
import random
import statistics
import time

import torch

import fa
import fa.integrations.transformers as fa_transformers

IMPLS = ("fa", "sdpa", "flash_attention_2", "flash_attention_3")


def llama_1b_config(transformers):
    """Llama 3.2 1B's shape: 16 layers, hidden 2048, 32 query heads and 8 kv heads of 64."""
    return transformers.LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, tie_word_embeddings=True,
        rope_theta=500000.0,
    )


def usable(model, impl):
    """Whether transformers loads `impl` here (flash-attn packages may be missing)."""
    if impl == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return "flash_attn does not import"
    try:
        model.set_attn_implementation(impl)
        ids = torch.randint(0, 1000, (1, 64), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()  # it runs (forward and backward)
        model.zero_grad(set_to_none=True)
    except Exception as e:  # transformers or the package says why (missing, unsupported)
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return None


def time_ms(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", default=",".join(IMPLS), help="comma-separated: " + ",".join(IMPLS))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens for generation")
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5, help="training steps timed per implementation")
    p.add_argument("--generate-rounds", type=int, default=2)
    args = p.parse_args()

    import transformers

    fa_transformers.register()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_1b_config(transformers)).to("cuda", torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    impls, skipped = [], {}
    for impl in args.impl.split(","):
        why = usable(model, impl)
        if why:
            skipped[impl] = why
        else:
            impls.append(impl)

    info = fa.build_info()
    print(f"# transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"fa {info.get('commit')}; Llama-shaped model, {params / 1e9:.2f} B parameters, bf16")
    for impl, why in skipped.items():
        print(f"# {impl}: not run ({why})")

    # Training: one step = forward, loss, backward, AdamW.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seqlen), device="cuda")
    model.train()

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    train = {impl: [] for impl in impls}
    for impl in impls:  # warm-up
        model.set_attn_implementation(impl)
        step(), step()
    for _ in range(args.rounds):
        for impl in random.sample(impls, len(impls)):
            model.set_attn_implementation(impl)
            train[impl].append(time_ms(step))
    optimizer.state.clear()  # frees the AdamW moments for generation
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()

    # Generation: greedy, one prompt, exactly new_tokens tokens.
    model.eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt), device="cuda")
    options = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                   eos_token_id=None, pad_token_id=0)
    gen = {impl: [] for impl in impls}

    def run(impl):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            model.generate(input_ids=prompt, **options)

    for impl in impls:
        run(impl)
    for _ in range(args.generate_rounds):
        for impl in random.sample(impls, len(impls)):
            gen[impl].append(time_ms(lambda: run(impl)) / args.new_tokens)

    print(f"\n| attn_implementation | training step, {args.batch} x {args.seqlen} tokens: tokens/s | ms/step "
          f"| greedy generation, {args.new_tokens} tokens: ms/token |")
    print("|---|---|---|---|")
    for impl in impls:
        ms = statistics.median(train[impl])
        print(f"| {impl} | {args.batch * args.seqlen / ms * 1e3:,.0f} | {ms:.1f} | {statistics.median(gen[impl]):.2f} |")
    print(f"\n{time.strftime('%Y-%m-%d')}; medians of {args.rounds} training steps and {args.generate_rounds} "
          "generations per implementation, rotated.")


if __name__ == "__main__":
    main()
