"""Our token output in TRL itself, one training step each of a tiny random Llama on the CPU: the real CLI's
`--export=tokens` Parquet through `SFTTrainer`, and the rollout_func of docs/rollouts.md driving a real
`Rollouts` through `GRPOTrainer`; both against the scripted endpoint sending vLLM's token ids. Needs torch and
trl (the `trl` extra; .ci/run installs them, and there a skip is a failure)."""

from __future__ import annotations

import importlib.util
import math

import pytest
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, write_dataset
from scripted_replies import IM_END, IM_START, render_prompt
from scripted_server import ScriptedServer
from token_helpers import TOY_CHARS, calls_of, docs_rollout_func, sampled, toy_tokenizer
from verify_helpers import answer, args_for, sh

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("trl") is None,
    reason="torch and trl are not installed (pip install -e '.[trl]', the CPU torch first: README, Development)",
)


def tiny_llama():
    """A random one-layer Llama whose vocabulary holds every id of the toy tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=3 + TOY_CHARS,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=IM_START,
        eos_token_id=IM_END,
        pad_token_id=IM_END,
    )
    return LlamaForCausalLM(config)


def cpu_step(tmp_path) -> dict:
    """The arguments every trainer here shares: one step on the CPU, nothing saved or reported."""
    return {
        "output_dir": str(tmp_path / "trainer"),
        "max_steps": 1,
        "use_cpu": True,
        "report_to": [],
        "logging_steps": 1,
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "bf16": False,  # TRL's default is bf16; a step in float32 on the CPU is the plain one
    }


def assistant_turns(body: dict) -> int:
    return sum(m["role"] == "assistant" for m in body["messages"])


def kept(rows: list[list[int]], masks: list[list[int]]) -> list[list[int]]:
    """Each row of a batch where its mask is 1 (its padding, or what the loss skips, left out)."""
    return [[v for v, m in zip(row, mask, strict=True) if m] for row, mask in zip(rows, masks, strict=True)]


SFT_SCRIPT = {
    "two calls": [sh("echo one"), answer("Done.")],
    "one call": [answer("Only this.")],
}


def test_sft_trainer_trains_on_exactly_the_sampled_ids_of_the_token_export(tmp_path):
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    data = write_dataset(tmp_path / "ds.jsonl", list(SFT_SCRIPT))
    flags = ["--token_ids", "--logprobs", "--export=tokens"]
    with ScriptedServer(script=SFT_SCRIPT) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v", *flags), tmp_path, srv)
    assert_clean_exit(done)
    lines = {prompt_of_record(r): r for r in RunDir(tmp_path / "out" / "v").trajectories()}
    # What TRL must train on: the ids the server sent as sampled, call after call, and nothing else.
    expected = {}
    for prompt, line in lines.items():
        tokens = line["tokens"]
        assert tokens["source"] == "endpoint" and tokens["drift"] is None
        labels = [i if m else -100 for i, m in zip(tokens["ids"], tokens["mask"], strict=True)]
        assert [i for i in labels if i != -100] == sum(sampled(SFT_SCRIPT[prompt]), [])
        expected[tuple(tokens["ids"])] = labels

    parquet = tmp_path / "out" / "v" / "export" / "tokens" / "data.parquet"
    dataset = load_dataset("parquet", data_files=str(parquet), split="train", cache_dir=str(tmp_path / "hf"))
    batches: list[dict] = []

    class Recording(SFTTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            batches.append({k: inputs[k].tolist() for k in ("input_ids", "labels", "attention_mask")})
            return super().compute_loss(model, inputs, *args, **kwargs)

    trainer = Recording(
        model=tiny_llama(),
        args=SFTConfig(**cpu_step(tmp_path), per_device_train_batch_size=2, max_length=None),
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(toy_tokenizer(tmp_path / "tok")),
    )
    # The labels TRL built from `assistant_masks` when it prepared the dataset...
    built = trainer.train_dataset
    assert {tuple(r["input_ids"]): r["labels"] for r in built} == expected
    result = trainer.train()
    # ...and the batch the step's loss was computed on (padding aside): the same rows, the same labels.
    (batch,) = batches
    ids = kept(batch["input_ids"], batch["attention_mask"])
    labels = kept(batch["labels"], batch["attention_mask"])
    assert {tuple(i): lab for i, lab in zip(ids, labels, strict=True)} == expected
    assert trainer.state.global_step == 1
    (logged,) = [e for e in trainer.state.log_history if "loss" in e]
    assert math.isfinite(logged["loss"]) and logged["loss"] > 0 and math.isfinite(result.training_loss)


GRPO_SCRIPT = {
    # Each sample writes its reward where its check reads it: the reward TRL gets comes from the sandbox.
    "task a": [sh("echo 0.25 > reward.txt"), answer("a is done")],
    "task b": [sh("echo 0.75 > reward.txt"), answer("b is done")],
}
FAILING = "task c"  # its samples fail on their first call: no tokens, no reward
REWARDS = {"task a": 0.25, "task b": 0.75, FAILING: None}


def test_grpo_trainer_with_the_docs_rollout_func_trains_on_what_the_endpoint_sampled(tmp_path):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agentbatch import Rollouts

    tasks = {p: {"prompt": p, "verify": "cat reward.txt"} for p in REWARDS}
    script = GRPO_SCRIPT | {FAILING: [{"fault": "400", "fault_times": 2}]}
    rewarded: list[dict] = []
    trained: list[dict] = []

    def reward_from_runner(prompts, completions, completion_ids, reward, **kw):
        rewarded.append({"prompts": list(prompts), "completion_ids": list(completion_ids), "reward": list(reward)})
        return reward

    class Recording(GRPOTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            trained.append({k: inputs[k].tolist() for k in ("prompt_ids", "prompt_mask", "completion_ids")})
            trained[-1]["loss_mask"] = (inputs["completion_mask"] * inputs["tool_mask"]).tolist()
            trained[-1]["completion_mask"] = inputs["completion_mask"].tolist()
            return super().compute_loss(model, inputs, *args, **kwargs)

    flags = {"model": "m", "api_key": "test-key", "sandbox": "local", "distribution": "terminal_only"}
    flags |= {"require_reasoning": False, "concurrency": 4, "token_ids": True, "logprobs": True, "max_retries": 0}
    with (
        ScriptedServer(script=script) as srv,
        Rollouts(**flags, base_url=srv.base_url, samples_per_prompt=2) as rollouts,
    ):
        trainer = Recording(
            model=tiny_llama(),
            reward_funcs=reward_from_runner,
            args=GRPOConfig(**cpu_step(tmp_path), per_device_train_batch_size=6, num_generations=2),
            train_dataset=Dataset.from_list([{"prompt": p} for p in tasks]),
            processing_class=AutoTokenizer.from_pretrained(toy_tokenizer(tmp_path / "tok")),
            rollout_func=docs_rollout_func()(rollouts, tasks.__getitem__),
        )
        trainer.train()
        bodies = srv.requests()

    # What the server saw and sent, per sample: its first prompt, everything after it up to its last reply (the
    # tool's result in the middle), and of that what the server sampled.
    expected = []
    for prompt, script in GRPO_SCRIPT.items():
        firsts, lasts = ([b for b in calls_of(bodies, prompt) if assistant_turns(b) == k] for k in (0, 1))
        assert len(firsts) == len(lasts) == 2  # two samples of two calls each
        (first,) = {tuple(render_prompt(b["messages"])) for b in firsts}
        replies = sampled(script)
        for last in lasts:
            whole = render_prompt(last["messages"]) + replies[-1]
            assert whole[: len(first)] == list(first)
            expected.append((prompt, list(first), whole[len(first) :], sum(replies, [])))
    # A failed sample as the adapter hands it over: an end-of-turn id each side, nothing of it trained on.
    expected += [(FAILING, [IM_END], [IM_END], [])] * 2

    # The reward functions got each entry's check reward, in the order TRL asked (prompts repeated, n each), and
    # the completion TRL decoded for it.
    (seen,) = rewarded
    assert sorted(seen["prompts"]) == sorted(list(REWARDS) * 2)
    assert seen["prompts"][0::2] == seen["prompts"][1::2]
    assert seen["reward"] == [REWARDS[p] for p in seen["prompts"]]
    given = sorted(zip(seen["prompts"], seen["completion_ids"], strict=True))
    assert given == sorted((p, completion) for p, _, completion, _ in expected)

    # The step's loss: over exactly the ids the server sampled (the tool's result and template ids masked out).
    (batch,) = trained
    rows = zip(
        kept(batch["prompt_ids"], batch["prompt_mask"]),
        kept(batch["completion_ids"], batch["completion_mask"]),
        kept(batch["completion_ids"], batch["loss_mask"]),
        strict=True,
    )
    assert sorted(rows) == sorted(e[1:] for e in expected)  # TRL shuffles the generation batch before the step
    assert all(len(completion) > len(ids) for p, _, completion, ids in expected if p != FAILING)
    assert trainer.state.global_step == 1
    (logged,) = [e for e in trainer.state.log_history if "loss" in e]
    assert math.isfinite(logged["loss"]) and logged["reward"] == pytest.approx(0.5)  # the failed ones left out
