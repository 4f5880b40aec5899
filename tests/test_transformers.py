"""attn_implementation="fa" in Hugging Face transformers (fa.integrations.transformers) on small
random models of the architectures whose attention differs: Llama (plain), Mistral (a sliding window
on every layer), Qwen2 (sliding and full layers), Gemma 2 (soft-capping, alternating windows),
Gemma 3 (5 sliding layers to 1 full), gpt-oss (sinks, sliding and full layers).

On the CPU fa runs in float32 and the reference is the model's eager attention in float64; on the
GPU fa runs in bfloat16 and the reference is eager in float32. fa's error must be within 1.5x of
what the model's other implementation in fa's dtype makes (SDPA, or eager where SDPA cannot express
the model's attention), plus a small slack.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import fa.integrations.transformers as fa_transformers  # noqa: E402
from helpers import cuda_kernels_available, skip_unless_softcap_built  # noqa: E402

fa_transformers.register()

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, attention_dropout=0.0, initializer_range=0.2)
WINDOW = 7  # shorter than the test sequences, so that the windows matter


def _models():
    t = transformers
    return {
        "llama": (t.LlamaConfig, dict(num_hidden_layers=2), t.LlamaForCausalLM),
        "mistral": (t.MistralConfig, dict(num_hidden_layers=2, sliding_window=WINDOW), t.MistralForCausalLM),
        "qwen2": (t.Qwen2Config, dict(num_hidden_layers=2, use_sliding_window=True, sliding_window=WINDOW,
                                      layer_types=["sliding_attention", "full_attention"]), t.Qwen2ForCausalLM),
        # soft-capping at 2, far below Gemma 2's 50, so that it changes these scores
        "gemma2": (t.Gemma2Config, dict(num_hidden_layers=2, sliding_window=WINDOW, attn_logit_softcapping=2.0,
                                        query_pre_attn_scalar=16), t.Gemma2ForCausalLM),
        "gemma3": (t.Gemma3TextConfig, dict(num_hidden_layers=6, sliding_window=WINDOW, query_pre_attn_scalar=16),
                   t.Gemma3ForCausalLM),
        "gpt_oss": (t.GptOssConfig, dict(num_hidden_layers=2, sliding_window=WINDOW, num_local_experts=4,
                                         num_experts_per_tok=2, max_position_embeddings=131072),
                    t.GptOssForCausalLM),
    }


MODELS = list(_models())
# The implementation fa is measured against, in fa's dtype: SDPA where the model allows it.
PEER = {"gemma2": "eager", "gpt_oss": "eager"}


@pytest.fixture(params=MODELS)
def model_name(request):
    return request.param


def dtype_of(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def reference_dtype(device):
    return torch.float64 if device == "cpu" else torch.float32


def base_model(name, seed=0):
    config_class, options, model_class = _models()[name]
    torch.manual_seed(seed)
    model = model_class(config_class(**COMMON, **options)).eval()
    if name == "gpt_oss":  # sinks drawn large enough to take a share of each row
        if hasattr(model, "set_experts_implementation"):  # the grouped GEMM has no float64
            model.set_experts_implementation("eager")
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    return model


def variant(model, attn, dtype, device):
    m = copy.deepcopy(model).to(device=device, dtype=dtype)
    m.set_attn_implementation(attn)
    return m


def skip_without_kernels(device, model_name=None):
    """Skips a CUDA case without fa's kernels, or (Gemma 2) without a soft-capping kernel in the family
    the device fixture chose: a build for 90a alone has none in the Ampere family."""
    if device != "cpu" and not cuda_kernels_available():
        pytest.skip("no fa CUDA kernels in this build")
    if model_name is not None and _models()[model_name][1].get("attn_logit_softcapping"):
        skip_unless_softcap_built(COMMON["head_dim"], device)


def ids_and_mask(batch, seqlen, pads=(), seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, COMMON["vocab_size"], (batch, seqlen), generator=gen)
    mask = torch.ones(batch, seqlen, dtype=torch.long)
    for row, (left, right) in enumerate(pads):
        mask[row, :left] = 0
        if right:
            mask[row, seqlen - right:] = 0
    return ids, mask


def err(x, ref, where=None):
    d = (x.double() - ref.double()).abs()
    return (d[where] if where is not None else d).max().item()


def assert_close_as_peer(name, got, peer, ref, where=None, factor=1.5):
    """fa's error vs the reference within `factor` x the peer's, plus 1e-5 of the reference's size."""
    assert not torch.isnan(got).any(), f"{name}: NaN"
    e, e_peer = err(got, ref, where), err(peer, ref, where)
    slack = 1e-5 * (ref[where] if where is not None else ref).double().abs().max().item()
    assert e <= factor * e_peer + slack, f"{name}: error {e:.3e}, {factor}x the peer's {e_peer:.3e} + {slack:.1e} allowed"


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(input_ids=ids.to(model.device), **{k: v.to(model.device) for k, v in kwargs.items()}).logits


def test_prefill_logits(device, model_name):
    skip_without_kernels(device, model_name)
    model = base_model(model_name)
    ids, _ = ids_and_mask(2, 23)
    fa_model = variant(model, "fa", dtype_of(device), device)
    ref = logits(variant(model, "eager", reference_dtype(device), device), ids)
    peer = logits(variant(model, PEER.get(model_name, "sdpa"), dtype_of(device), device), ids)
    assert_close_as_peer("logits", logits(fa_model, ids), peer, ref)


def test_padded_batch(device, model_name):
    # Row 0 left-padded, row 1 right-padded, row 2 not padded: real tokens as the reference's, and
    # no NaN anywhere (padded rows too). The reference runs each row's real tokens alone, at the same
    # positions (eager in float64 turns a left-padded row into NaN).
    skip_without_kernels(device, model_name)
    model = base_model(model_name)
    ids, mask = ids_and_mask(3, 21, pads=[(5, 0), (0, 4), (0, 0)])
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    reference_model = variant(model, "eager", reference_dtype(device), device)
    ref = torch.zeros(*ids.shape, COMMON["vocab_size"], dtype=reference_dtype(device), device=device)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        ref[row, real.to(device)] = logits(reference_model, ids[row, real][None], position_ids=positions[row, real][None])[0]
    peer = logits(variant(model, PEER.get(model_name, "sdpa"), dtype_of(device), device), ids, attention_mask=mask,
                  position_ids=positions)
    got = logits(variant(model, "fa", dtype_of(device), device), ids, attention_mask=mask, position_ids=positions)
    assert not torch.isnan(got).any()
    assert_close_as_peer("logits of real tokens", got, peer, ref, where=mask.bool().to(got.device))


@pytest.mark.parametrize("how", ["position_ids", "cu_seq_lens"])
def test_packed_sequences(device, model_name, how):
    # Two sequences in one row equal the same sequences run on their own.
    skip_without_kernels(device, model_name)
    model = variant(base_model(model_name), "fa", dtype_of(device), device)
    first, _ = ids_and_mask(1, 10, seed=2)
    second, _ = ids_and_mask(1, 14, seed=3)
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(10), torch.arange(14)])[None]
    extra = {}
    if how == "cu_seq_lens":
        cu = torch.tensor([0, 10, 24], dtype=torch.int32, device=model.device)
        extra = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=14, max_length_k=14)
    with torch.no_grad():
        got = model(input_ids=packed.to(model.device), position_ids=positions.to(model.device), **extra).logits
    alone = torch.cat([logits(model, first), logits(model, second)], dim=1)
    tol = 1e-5 if device == "cpu" else 3e-2
    torch.testing.assert_close(got, alone, atol=tol * alone.abs().max().item(), rtol=0)


def test_training_step(device, model_name):
    # The gradients of every attention weight after one loss.backward(), within 1.5x the peer's error.
    # The errors are summed over three batches: in bfloat16 one batch's error is noise of the whole
    # model, and the sinks have one value a head.
    skip_without_kernels(device, model_name)
    model = base_model(model_name).train()
    models = {"ref": variant(model, "eager", reference_dtype(device), device),
              "peer": variant(model, PEER.get(model_name, "sdpa"), dtype_of(device), device),
              "fa": variant(model, "fa", dtype_of(device), device)}
    errors = {}
    for seed in range(3):
        ids, mask = ids_and_mask(2, 19, pads=[(0, 3), (0, 0)], seed=seed)  # right padding, as training batches have
        labels = torch.randint(0, COMMON["vocab_size"], ids.shape, generator=torch.Generator().manual_seed(5 + seed))
        labels[mask == 0] = -100  # no loss on padding
        grads = {}
        for role, m in models.items():
            m.zero_grad(set_to_none=True)
            m(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss.backward()
            grads[role] = {n: p.grad for n, p in m.named_parameters() if "self_attn" in n}
        ref, peer, got = grads["ref"], grads["peer"], grads["fa"]
        assert set(got) == set(ref) and got
        for n in ref:
            assert got[n] is not None and not torch.isnan(got[n]).any(), f"{n}: no gradient, or NaN"
            e = errors.setdefault(n, [0.0, 0.0, 0.0])
            e[0] += err(got[n], ref[n])
            e[1] += err(peer[n], ref[n])
            e[2] += ref[n].double().abs().max().item()
    for n, (e, e_peer, size) in errors.items():
        assert e <= 1.5 * e_peer + 1e-5 * size, f"{n}: error {e:.3e}, 1.5x the peer's {e_peer:.3e} allowed"


@pytest.mark.parametrize("how", ["env", "kwarg"])
def test_deterministic_training(device, how, monkeypatch):
    """transformers' FLASH_ATTENTION_DETERMINISTIC=1 (or a deterministic=True keyword reaching the
    attention) makes fa's backward deterministic: two training steps give the same gradients, bit
    for bit, and every backward op call was asked to be deterministic."""
    skip_without_kernels(device)
    from test_deterministic import _BackwardFlags

    model = variant(base_model("qwen2").train(), "fa", dtype_of(device), device)
    ids, mask = ids_and_mask(2, 19, pads=[(0, 3), (0, 0)])
    kwargs = {}
    if how == "env":
        monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", "1")
    else:
        kwargs["deterministic"] = True
    runs = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        with _BackwardFlags() as mode:
            model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=ids.to(device),
                  **kwargs).loss.backward()
        assert mode.flags and all(mode.flags), mode.flags
        runs.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_dropout_in_training_is_an_error(device):
    skip_without_kernels(device)
    model = base_model("llama")
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    m = variant(model, "fa", dtype_of(device), device).train()
    with pytest.raises(ValueError, match="fa has no attention dropout.*LlamaConfig"):
        m(input_ids=torch.ones(1, 5, dtype=torch.long, device=device))
    m.eval()  # no dropout at evaluation
    logits(m, torch.ones(1, 5, dtype=torch.long))


def generate(model, ids, mask, cache, new_tokens=32, compile_config=None, forced=None):
    """generate(): the greedy tokens after the prompt and each step's logits (steps, B, vocab).
    forced (B, new_tokens): take these tokens instead (teacher forcing through the real decoding
    path: the cache, and fa.attention_kvcache), the logits still the model's own."""
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                   eos_token_id=None, return_dict_in_generate=True, output_logits=True)
    if cache == "static":
        options["cache_implementation"] = "static"
    if compile_config is not None:
        options["compile_config"] = compile_config
    else:
        options["disable_compile"] = True  # generate() compiles static-cache steps on a GPU by itself
    if forced is not None:
        options["logits_processor"] = transformers.LogitsProcessorList([_Force(forced.to(model.device))])
    out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), **options)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits)


class _Force:
    def __init__(self, tokens):
        self.tokens, self.step = tokens, 0

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, self.tokens[:, self.step:self.step + 1], 0.0)
        self.step += 1
        return forced


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation(device, model_name, cache):
    # 32 greedy tokens for a left-padded batch, the queries decoding against the cache through
    # fa.attention_kvcache with cache_leftpad. fa runs teacher-forced on eager's tokens, so that each
    # step compares the two on the same prefix (a random model's near ties would otherwise make one
    # different token change all that follow): fa's own choice is eager's on >= 90% of the steps, and
    # its logits are eager's within the dtype's error at every step.
    skip_without_kernels(device, model_name)
    model = base_model(model_name)
    ids, mask = ids_and_mask(2, 9, pads=[(4, 0), (0, 0)])
    eager, eager_logits = generate(variant(model, "eager", dtype_of(device), device), ids, mask, cache)
    fa_model = variant(model, "fa", dtype_of(device), device)
    _, got_logits = generate(fa_model, ids, mask, cache, forced=eager)
    own_choice = got_logits.argmax(-1).t()  # (B, steps)
    same = (own_choice == eager).double().mean().item()
    assert same >= 0.9, f"{same:.0%} of fa's greedy tokens are eager's"
    tol = (1e-4 if device == "cpu" else 5e-2) * eager_logits.abs().max().item()
    torch.testing.assert_close(got_logits, eager_logits, atol=tol, rtol=0)
    free, _ = generate(fa_model, ids, mask, cache)  # and on its own
    assert free.shape == eager.shape


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_static_cache_without_a_mask(device, name):
    # A decoding loop of one's own over a static cache, no attention_mask: the cache's unfilled slots
    # must not be attended (fa's mask function marks them from the cache position).
    skip_without_kernels(device, name)
    model = base_model(name)

    def run(attn):
        m = variant(model, attn, dtype_of(device), device)
        cache = transformers.StaticCache(config=m.config, max_cache_len=40)
        token, steps = torch.arange(3, 12, device=device)[None], []
        with torch.no_grad():
            for i in range(10):
                pos = torch.arange(9, device=device) if i == 0 else torch.tensor([8 + i], device=device)
                out = m(input_ids=token, past_key_values=cache, use_cache=True, cache_position=pos,
                        position_ids=pos[None])
                steps.append(out.logits[:, -1])
                token = out.logits[:, -1:].argmax(-1)
        return torch.stack(steps)

    eager, got = run("eager"), run("fa")
    tol = (1e-4 if device == "cpu" else 5e-2) * eager.abs().max().item()
    torch.testing.assert_close(got, eager, atol=tol, rtol=0)


def test_static_cache_compiles_without_graph_break(device):
    # generate() with a static cache compiles the decoding step; fullgraph=True makes a graph break an
    # error. On the CPU the "eager" backend (Dynamo's tracing alone) keeps it short.
    skip_without_kernels(device)
    model = variant(base_model("mistral"), "fa", dtype_of(device), device)
    ids, mask = ids_and_mask(2, 9, pads=[(4, 0), (0, 0)])
    compile_config = transformers.CompileConfig(fullgraph=True, backend="eager" if device == "cpu" else "inductor")
    compile_config._compile_all_devices = True
    torch._dynamo.reset()
    eager, _ = generate(model, ids, mask, "static", new_tokens=6)
    torch._dynamo.utils.counters.clear()
    compiled, _ = generate(model, ids, mask, "static", new_tokens=6, compile_config=compile_config)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1, "generate() compiled nothing"
    assert torch.equal(compiled, eager)


def test_float32_model_on_the_gpu_is_an_error(family):
    model = variant(base_model("llama"), "fa", torch.float32, "cuda")
    with pytest.raises(ValueError, match="LlamaConfig runs attention in float32 on the GPU"):
        logits(model, torch.ones(1, 5, dtype=torch.long))


def test_a_4d_mask_is_an_error(device):
    skip_without_kernels(device)
    model = variant(base_model("llama"), "fa", dtype_of(device), device)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool, device=device)
    with pytest.raises(ValueError, match="fa takes transformers' 2-D padding mask"):
        model(input_ids=torch.ones(1, 5, dtype=torch.long, device=device), attention_mask=mask)


def test_from_pretrained_and_the_flattening_collator(tmp_path):
    # The documented use: a saved model loaded with attn_implementation="fa", fed by transformers'
    # padding-free collator (position_ids, and the flash-attn keyword arguments).
    model = base_model("qwen2")
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="fa",
                                                               dtype=torch.float32).eval()
    assert loaded.config._attn_implementation == "fa"
    first, _ = ids_and_mask(1, 10, seed=2)
    second, _ = ids_and_mask(1, 14, seed=3)
    alone = torch.cat([logits(loaded, first), logits(loaded, second)], dim=1)
    for kwargs in (dict(return_position_ids=True), dict(return_flash_attn_kwargs=True)):
        collator = transformers.DataCollatorWithFlattening(**kwargs)
        batch = collator([{"input_ids": first[0].tolist()}, {"input_ids": second[0].tolist()}])
        batch.pop("labels", None)
        with torch.no_grad():
            got = loaded(**batch).logits
        torch.testing.assert_close(got, alone, atol=1e-5 * alone.abs().max().item(), rtol=0)
