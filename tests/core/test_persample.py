"""Ghost norms (grad_sq_norms) against the per-sample autograd loop (reference_grad_sq_norms):
CNN, MLPs with norm layers and sequence inputs, ResNet-18 with batch and group norm, ``names``
subsets, num_seen masking, and the vmap fallback for layers the ghost path does not cover."""
import copy

import pytest
import torch
from torch import nn

from fedlib.core import persample
from fedlib.core.persample import grad_sq_norms, reference_grad_sq_norms
from fedlib.federated.models import SmallCNN, resnet18_cifar

RTOL = 1e-5


def close(a, b, rtol=RTOL):
    return a.shape == b.shape and float(((a - b).abs() / b.abs().clamp_min(1e-300)).max()) < rtol


def randomize_norms(model: nn.Module) -> nn.Module:
    """Non-trivial affine weights and running statistics, so every norm-layer term matters."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model


class Seq(nn.Module):
    """Linear layers on (n, T, d) sequences (Gram form: T = 3 positions, 16 -> 16 features;
    materialised: 3 x 2 -> 4), LayerNorm over the features, mean over positions."""

    def __init__(self, d: int = 16, classes: int = 6):
        super().__init__()
        self.inp = nn.Linear(2, d)
        self.mix = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.small = nn.Linear(d, 4)
        self.out = nn.Linear(4, classes)

    def forward(self, x):  # x (n, 6) -> (n, 3, 2)
        h = torch.tanh(self.inp(x.view(x.shape[0], 3, 2)))
        h = self.ln(torch.tanh(self.mix(h)))
        return self.out(torch.tanh(self.small(h)).mean(1))


class Convs(nn.Module):
    """Conv2d with stride, padding, dilation, no bias, 1x1, and a BatchNorm1d head."""

    def __init__(self, classes: int = 6):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(4, 16, 3, padding=2, dilation=2, bias=False)      # materialised
        self.c3 = nn.Conv2d(16, 32, (3, 2), stride=(2, 1), padding=(1, 0))    # Gram: few positions, wide
        self.c4 = nn.Conv2d(32, 8, 1)
        self.gn = nn.GroupNorm(2, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        h = torch.relu(self.c1(x))
        h = torch.relu(self.c3(torch.relu(self.c2(h))))
        h = self.gn(self.c4(h)).mean((2, 3))
        return self.fc(self.bn(h))


def test_smallcnn_matches_loop_with_names_subsets_and_masking():
    torch.manual_seed(0)
    model = SmallCNN(1, 10, 12, width=3, hidden=8).double()
    x = torch.randn(11, 1, 12, 12, dtype=torch.float64)
    y = torch.randint(0, 4, (11,))
    for names in [None, ["conv1.weight", "conv2.bias"], ["fc.bias", "classifier.weight"], ["conv2.weight"]]:
        for num_seen in (4, 10):                       # classes 4..9 masked, or none
            ref = reference_grad_sq_norms(model, x, y, num_seen, names)
            assert close(grad_sq_norms(model, x, y, num_seen, names, batch_size=4), ref), (names, num_seen)
    assert close(persample.vmap_grad_sq_norms(model, x, y, 4, batch_size=4), reference_grad_sq_norms(model, x, y, 4))
    # float32 agrees to float32 round-off
    m32 = copy.deepcopy(model).float()
    assert close(grad_sq_norms(m32, x.float(), y, 4), reference_grad_sq_norms(m32, x.float(), y, 4), 1e-4)


@pytest.mark.parametrize("make, shape", [(Seq, (6,)), (Convs, (2, 11, 9))])
def test_layer_kinds_match_loop(make, shape):
    torch.manual_seed(1)
    model = randomize_norms(make().double())
    x = torch.randn(7, *shape, dtype=torch.float64)
    y = torch.randint(0, 5, (7,))
    assert persample.ghost_layers(model, persample.default_names(model)) is not None   # the ghost path runs
    ref = reference_grad_sq_norms(model, x, y, 5)
    assert close(grad_sq_norms(model, x, y, 5, batch_size=3), ref)
    half = [n for i, (n, _) in enumerate(model.named_parameters()) if i % 2]
    assert close(grad_sq_norms(model, x, y, 5, half), reference_grad_sq_norms(model, x, y, 5, half))


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_resnet18_matches_loop(norm):
    torch.manual_seed(2)
    model = randomize_norms(resnet18_cifar(3, 10, norm=norm)).double().train()
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    y = torch.randint(0, 6, (4,))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = reference_grad_sq_norms(model, x, y, 6)
    assert close(grad_sq_norms(model, x, y, 6, batch_size=3), ref)
    some = ["stem.0.weight", "stages.1.0.shortcut.1.weight", "stages.3.1.bn2.bias", "classifier.weight"]
    assert close(grad_sq_norms(model, x, y, 6, some), reference_grad_sq_norms(model, x, y, 6, some))
    # mode, running statistics, flags and .grad untouched
    assert model.training and all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_requires_grad_flags_select_and_are_restored():
    torch.manual_seed(3)
    model = SmallCNN(1, 5, 8, width=2, hidden=4).double()
    model.conv1.requires_grad_(False)
    x, y = torch.randn(5, 1, 8, 8, dtype=torch.float64), torch.randint(0, 5, (5,))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert close(grad_sq_norms(model, x, y, 5), reference_grad_sq_norms(model, x, y, 5, trainable))
    assert not model.conv1.weight.requires_grad and model.fc.weight.requires_grad
    assert grad_sq_norms(model, x[:0], y[:0], 5).shape == (0,)


class Scale(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.s = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * self.s


class Shared(nn.Module):
    """One Linear applied twice: its per-sample gradient sums two calls."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.a(torch.tanh(self.a(x)))))


def unsupported_models():
    torch.manual_seed(4)
    return {
        "custom parameter": (nn.Sequential(nn.Linear(4, 5), Scale(5), nn.Tanh(), nn.Linear(5, 3)), (4,)),
        "PReLU": (nn.Sequential(nn.Linear(4, 5), nn.PReLU(5), nn.Linear(5, 3)), (4,)),
        "grouped conv": (nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4 * 3 * 3, 3)), (2, 5, 5)),
        "module called twice": (Shared(), (4,)),
        "in-place ReLU on a conv output": (nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(inplace=True), nn.Flatten(),
                                                         nn.Linear(27, 3)), (2, 5, 5)),
        "tied weights": (nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3)), (4,)),
    }


@pytest.mark.parametrize("kind", list(unsupported_models()))
def test_unsupported_layers_fall_back_to_vmap_and_stay_exact(kind):
    model, shape = unsupported_models()[kind]
    if kind == "tied weights":
        model[2].weight = model[0].weight
    model = model.double()
    x, y = torch.randn(6, *shape, dtype=torch.float64), torch.randint(0, 3, (6,))
    names = persample.default_names(model)
    if kind in ("module called twice", "in-place ReLU on a conv output"):   # detected during the forward
        layers = persample.ghost_layers(model, names)
        assert layers is not None
        with persample._eval_mode(model), persample._trainable(model, names), torch.enable_grad():
            assert persample._ghost_chunk(model, layers, x, y, 3) is None
    else:                                                                      # detected from the modules
        assert persample.ghost_layers(model, names) is None
    assert close(grad_sq_norms(model, x, y, 3, batch_size=4), reference_grad_sq_norms(model, x, y, 3))


def test_frozen_unsupported_layer_keeps_the_ghost_path():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(4, 5), Scale(5), nn.Tanh(), nn.Linear(5, 3)).double()
    model[1].s.requires_grad_(False)
    names = persample.default_names(model)
    assert "1.s" not in names and persample.ghost_layers(model, names) is not None
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    assert close(grad_sq_norms(model, x, y, 3), reference_grad_sq_norms(model, x, y, 3, names))
