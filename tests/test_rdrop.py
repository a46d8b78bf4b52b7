"""R-Drop (training.rdrop_alpha, vaswani_mt/recipe/rdrop.py): the batch through the model twice, the symmetric KL
divergence of the two passes' outputs added to their label-smoothed cross-entropy."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vaswani_mt.model.modeling_vaswani import label_smoothed_cross_entropy
from vaswani_mt.recipe import loss as recipe_loss
from vaswani_mt.recipe.config import ConfigError, load_run_config
from vaswani_mt.recipe.rdrop import (duplicated, projected_rdrop_label_smoothed_cross_entropy,
                                     rdrop_label_smoothed_cross_entropy)
from vaswani_mt.recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments

sys.path.insert(0, str(Path(__file__).parent))
from trainer_helpers import common  # noqa: E402
from trainer_helpers.common import PER_DEVICE_BATCH  # noqa: E402

VOCAB = 11
PAD = 1


def _two_passes(seed=0, shape=(3, 7)):
    """Logits of two passes of a batch (``[2B, T, V]``, the second near the first, as two dropout masks make them)
    and the batch's labels, with padded positions."""
    generator = torch.Generator().manual_seed(seed)
    first = 3 * torch.randn(*shape, VOCAB, generator=generator)
    second = first + torch.randn(*shape, VOCAB, generator=generator)
    labels = torch.randint(2, VOCAB, shape, generator=generator)
    labels[0, -3:] = -100
    labels[2, -1] = PAD
    return torch.cat([first, second]), labels


def _kl_of_the_authors(logits, labels, pad_token_id):
    """Σ over counted tokens of ½ (KL(p1‖p2) + KL(p2‖p1)), written as the R-Drop paper's criterion does it: torch's
    kl_div in both directions, padded positions zeroed."""
    first, second = logits.float().chunk(2)
    counted = ((labels != -100) & (labels != pad_token_id)).unsqueeze(-1)
    one_way = F.kl_div(F.log_softmax(first, -1), F.softmax(second, -1), reduction="none")
    other_way = F.kl_div(F.log_softmax(second, -1), F.softmax(first, -1), reduction="none")
    return 0.5 * (one_way.masked_fill(~counted, 0).sum() + other_way.masked_fill(~counted, 0).sum())


@pytest.mark.parametrize("alpha", [0.0, 5.0])
def test_the_loss_is_the_mean_of_both_passes_smoothed_loss_plus_half_alpha_times_the_authors_kl(alpha):
    logits, labels = _two_passes()
    loss, nll, count = rdrop_label_smoothed_cross_entropy(logits, labels, alpha, 0.1, pad_token_id=PAD)
    (smoothed_1, nll_1, count_1), (smoothed_2, nll_2, _) = (
        label_smoothed_cross_entropy(half, labels, 0.1, pad_token_id=PAD) for half in logits.chunk(2))
    expected = 0.5 * (smoothed_1 + smoothed_2) + 0.5 * alpha * _kl_of_the_authors(logits, labels, PAD)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, 0.5 * (nll_1 + nll_2))
    assert count.item() == count_1.item() == int(((labels != -100) & (labels != PAD)).sum())


def test_two_identical_passes_give_the_plain_loss_and_gradient_whatever_alpha():
    """KL is 0 at p1 = p2, and so is its gradient: only dropout's difference between the passes regularises."""
    logits, labels = _two_passes()
    single = logits[:3].clone().requires_grad_()
    twice = torch.cat([single, single])
    loss, _, _ = rdrop_label_smoothed_cross_entropy(twice, labels, 5.0, 0.1, pad_token_id=PAD)
    (grad,) = torch.autograd.grad(loss, single)
    plain = single.detach().clone().requires_grad_()
    expected, _, _ = label_smoothed_cross_entropy(plain, labels, 0.1, pad_token_id=PAD)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, plain.grad)


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("pad_token_id", [None, PAD])
def test_the_projected_loss_equals_the_loss_of_the_logits_in_value_and_gradient(monkeypatch, autocast, with_bias,
                                                                               pad_token_id):
    """Blocks of 3 row pairs over the counted rows of 4 x 9 positions: several blocks and a short last one. Under
    bfloat16 autocast both compute the projection and its gradients' products in bfloat16, whose rounding of
    gradients of up to a few units (alpha 5) is up to a few hundredths."""
    monkeypatch.setattr(recipe_loss, "BLOCK_ELEMENTS", 3 * VOCAB)
    generator = torch.Generator().manual_seed(6)
    first = torch.randn(4, 9, 5, generator=generator)
    hidden = torch.cat([first, first + 0.3 * torch.randn(4, 9, 5, generator=generator)])
    weight = torch.randn(VOCAB, 5, generator=generator)
    bias = torch.randn(VOCAB, generator=generator) if with_bias else None
    labels = torch.randint(2, VOCAB, (4, 9), generator=generator)
    labels[0, -4:], labels[1, 0] = -100, PAD
    ours = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    theirs = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, nll, count = projected_rdrop_label_smoothed_cross_entropy(*ours, labels, 5.0, 0.1,
                                                                        pad_token_id=pad_token_id, bias=bias)
        logits = F.linear(*theirs) + (bias if with_bias else 0)
        expected = rdrop_label_smoothed_cross_entropy(logits, labels, 5.0, 0.1, pad_token_id=pad_token_id)
    loss.backward()
    expected[0].backward()
    tolerance = dict(rtol=2e-2, atol=4e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((loss, nll), expected[:2], **tolerance)
    assert count.item() == expected[2].item() and not nll.requires_grad
    for mine, reference in zip(ours, theirs):
        assert mine.grad.dtype == torch.float32
        torch.testing.assert_close(mine.grad, reference.grad, **tolerance)
    assert torch.all(ours[0].grad[:4][labels == -100] == 0) and torch.all(ours[0].grad[4:][labels == -100] == 0)


def test_a_batch_not_given_twice_is_refused_naming_both_shapes():
    logits, labels = _two_passes()
    with pytest.raises(ValueError, match=r"logits must hold the batch twice \(duplicated\): shape \(2 \* 3, 7"):
        rdrop_label_smoothed_cross_entropy(logits[:3], labels, 5.0)
    with pytest.raises(ValueError, match=r"hidden_states must hold the batch twice"):
        projected_rdrop_label_smoothed_cross_entropy(torch.randn(3, 7, 4), torch.randn(VOCAB, 4), labels, 5.0)


def test_duplicated_stacks_every_tensor_of_the_batch_on_itself():
    batch = {"input_ids": torch.tensor([[5, 6], [7, 0]]), "attention_mask": torch.tensor([[1, 1], [1, 0]]),
             "use_cache": False}
    twice = duplicated(batch)
    assert twice["input_ids"].tolist() == [[5, 6], [7, 0], [5, 6], [7, 0]]
    assert twice["attention_mask"].shape == (4, 2) and twice["use_cache"] is False


def _trainer(tmp_path, model, **settings):
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_tokens=64, **settings)
    return VaswaniTrainer(model=model, args=args)


def test_without_dropout_a_training_step_of_r_drop_is_the_plain_step():
    """Both passes of a model without dropout are the same, so R-Drop's loss and gradient are the plain ones."""
    batch = common.pad_collator(common.accumulation_examples(PER_DEVICE_BATCH))
    grads = {}
    for alpha in (0.0, 5.0):
        model = common.make_model(seed=0).train()
        trainer = _trainer(Path("/nonexistent-output") / str(alpha), model, rdrop_alpha=alpha)
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        grads[alpha] = (loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
        assert int(trainer._target_tokens_since_log) == int(((batch["labels"] != -100) & (batch["labels"] != 0)).sum())
    torch.testing.assert_close(grads[5.0][0], grads[0.0][0], rtol=1e-5, atol=1e-6)
    for mine, plain in zip(grads[5.0][1], grads[0.0][1]):
        torch.testing.assert_close(mine, plain, rtol=1e-4, atol=1e-6)


def test_with_dropout_the_two_passes_differ_and_the_kl_term_adds_to_the_loss(monkeypatch):
    """With dropout the passes get their own masks: at the same seed R-Drop's loss exceeds its cross-entropy part
    (alpha 0 with the same draws), and outside training the batch goes through once, whatever alpha."""
    import vaswani_mt.recipe.trainer as trainer_module

    batch = common.pad_collator(common.accumulation_examples(PER_DEVICE_BATCH))
    losses = {}
    for alpha in (0.0, 5.0):
        model = common.make_model(seed=0)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.3
        model.config.dropout = 0.3
        trainer = _trainer(Path("/nonexistent-output") / str(alpha), model.train(), rdrop_alpha=alpha)
        torch.manual_seed(3)
        losses[alpha] = trainer.compute_loss(model, duplicated(batch) if alpha == 0.0 else batch).item()
    assert losses[5.0] > losses[0.0]

    seen = []
    monkeypatch.setattr(trainer_module, "duplicated", lambda inputs: seen.append(inputs) or duplicated(inputs))
    trainer.compute_loss(model.eval(), batch)
    assert seen == []


def test_a_negative_alpha_is_refused_in_one_line_naming_the_setting(tmp_path):
    with pytest.raises(ConfigError, match=r"training\.rdrop_alpha must be >= 0 \(0: none\), got -1"):
        load_run_config("multi30k-en-de", {"data.path": str(tmp_path), "training.rdrop_alpha": -1.0})
    with pytest.raises(ValueError, match=r"rdrop_alpha must be >= 0"):
        VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], rdrop_alpha=-1.0)


def test_a_card_names_r_drop_only_when_the_run_had_it():
    from vaswani_mt.publishing.model_card import _recipe_rows

    assert dict(_recipe_rows({"rdrop_alpha": 5.0}))["R-Drop"].startswith("α = 5.0: each batch through the model twice")
    assert "R-Drop" not in dict(_recipe_rows({"rdrop_alpha": 0.0}))
