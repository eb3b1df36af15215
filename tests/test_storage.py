"""tpu storages behave as CPU's: slices alias their parent both ways, item get/set, typed storage
classes, host copies, and pickle / torch.save round-trips (views still sharing one storage)."""

from __future__ import annotations

import io
import pickle
import warnings

import pytest
import torch

import torch_tpu

TPU = "tpu"
DEVICES = ("cpu", TPU)


@pytest.fixture(autouse=True)
def _quiet_typed_storage():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "TypedStorage is deprecated")
        yield


def on_slice(storage: torch.UntypedStorage, dtype: torch.dtype, size, stride=None, offset: int = 0) -> torch.Tensor:
    """A tensor of `dtype` on `storage` (e.g. a storage slice), through tensor.set_()."""
    stride = stride if stride is not None else torch.empty(size).stride()
    return torch.tensor((), dtype=dtype, device=storage.device).set_(storage, offset, torch.Size(size), stride)


def both(fn):
    """`fn(device)` on CPU and on tpu."""
    return [fn(d) for d in DEVICES]


def assert_same(cpu, tpu):
    if isinstance(cpu, torch.Tensor):
        assert tpu.device.type == TPU and tpu.dtype == cpu.dtype and tpu.shape == cpu.shape
        assert torch.equal(tpu.cpu(), cpu)
    elif isinstance(cpu, (list, tuple)):
        assert type(tpu) is type(cpu) and len(tpu) == len(cpu)
        for c, t in zip(cpu, tpu):
            assert_same(c, t)
    else:
        assert tpu == cpu


# ---- storage slices


@pytest.mark.parametrize("start,stop", [(4, 8), (0, 40), (12, 40), (8, 8), (-8, None)])
def test_slice_reads_parent(start, stop):
    def run(d):
        s = torch.arange(10.0, device=d).untyped_storage()
        sl = s[start:stop]
        return sl.nbytes(), sl.data_ptr() - s.data_ptr(), sl.cpu().tolist(), sl.device.type

    cpu, tpu = both(run)
    assert tpu[:3] == cpu[:3] and tpu[3] == TPU


def test_slice_of_slice():
    def run(d):
        s = torch.arange(16, dtype=torch.int32, device=d).untyped_storage()
        inner = s[8:48][4:12]
        return inner.data_ptr() - s.data_ptr(), on_slice(inner, torch.int32, (2,))

    cpu, tpu = both(run)
    assert tpu[0] == cpu[0]
    assert_same(cpu[1], tpu[1])


def test_write_through_slice_hits_parent():
    def run(d):
        base = torch.arange(8.0, device=d)
        t = on_slice(base.untyped_storage()[8:24], torch.float32, (4,))
        t.mul_(10)
        t[1] = -1
        t.copy_(t + 0.5)
        return base, t

    assert_same(*both(run))


def test_write_to_parent_seen_through_slice():
    def run(d):
        base = torch.arange(8.0, device=d)
        t = on_slice(base.untyped_storage()[8:24], torch.float32, (2, 2))
        before = t.clone()
        base[3] = 100
        base[4:6].fill_(-2)
        return before, t, t.sum(), t + 1

    assert_same(*both(run))


def test_set_strided_view_on_slice():
    def run(d):
        base = torch.arange(12.0, device=d)
        t = on_slice(base.untyped_storage()[8:48], torch.float32, (2, 3), (1, 3), offset=1)
        t.add_(1000)
        return base, t, t.t().contiguous()

    assert_same(*both(run))


def test_slice_reinterpreted_as_another_dtype():
    def run(d):
        base = torch.arange(8, dtype=torch.int32, device=d)
        sl = base.untyped_storage()[4:20]
        bytes_view = on_slice(sl, torch.uint8, (16,))
        halves = on_slice(sl, torch.int16, (8,))
        halves[0] = 7
        return bytes_view, halves, base

    assert_same(*both(run))


def test_slice_keeps_parent_alive():
    def run(d):
        sl = torch.arange(6.0, device=d).untyped_storage()[8:24]
        return on_slice(sl, torch.float32, (4,)) * 2

    assert_same(*both(run))


def test_foreach_op_on_parent_and_slice():
    # Two mutable tensors on one buffer (one of them through a slice): neither write is lost.
    def run(d):
        base = torch.arange(8.0, device=d)
        t = on_slice(base.untyped_storage()[16:32], torch.float32, (4,))
        found = torch.zeros(1, device=d)
        torch._amp_foreach_non_finite_check_and_unscale_([base[:2], t], found, torch.full((1,), 0.5, device=d))
        return base, found

    assert_same(*both(run))


def test_misaligned_slice_raises_not_misreads():
    s = torch.arange(4.0, device=TPU).untyped_storage()[2:10]
    with pytest.raises(RuntimeError, match="misaligned"):
        on_slice(s, torch.float32, (2,)).cpu()


def test_sliced_storage_is_not_resizable():
    def run(d):
        with pytest.raises(RuntimeError) as e:
            on_slice(torch.arange(4.0, device=d).untyped_storage()[0:8], torch.float32, (2,)).resize_(8)
        return type(e.value)

    cpu, tpu = both(run)
    assert tpu is cpu


# ---- storage item access


def test_storage_item_get():
    def run(d):
        s = torch.tensor([1.5, -2.0], device=d).untyped_storage()
        return [s[i] for i in range(-8, 8)]

    cpu, tpu = both(run)
    assert tpu == cpu


def test_storage_item_set_and_slice_fill():
    def run(d):
        base = torch.zeros(4, dtype=torch.int32, device=d)
        s = base.untyped_storage()
        s[0] = 7
        s[15] = 255  # (CPU's storage item set takes no negative index)
        s[4:8] = 3
        s[9:11][0] = 1  # through a slice
        return base, s.tolist()

    assert_same(*both(run))


@pytest.mark.parametrize("index", [16, -17])
def test_storage_item_out_of_range(index):
    def run(d):
        s = torch.zeros(4, device=d).untyped_storage()
        with pytest.raises(IndexError) as e:
            s[index]
        return str(e.value)

    cpu, tpu = both(run)
    assert tpu == cpu


# ---- typed storages


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.int64, torch.int8, torch.uint8, torch.bool, torch.bfloat16]
)
def test_storage_type(dtype):
    cpu_type = torch.zeros(2, dtype=dtype).storage_type()
    tpu_type = torch.zeros(2, dtype=dtype, device=TPU).storage_type()
    assert tpu_type is getattr(torch.tpu, cpu_type.__name__)
    assert tpu_type.__module__ == "torch.tpu" and tpu_type.dtype == dtype


def test_typed_storage_classes():
    s = torch.tpu.FloatStorage(3)
    assert s.device.type == TPU and s.dtype == torch.float32 and s.size() == 3
    assert isinstance(torch.zeros(2, device=TPU).storage(), torch.tpu.FloatStorage)
    assert not isinstance(torch.zeros(2).storage(), torch.tpu.FloatStorage)
    assert not isinstance(torch.zeros(2, device=TPU).storage(), torch.tpu.DoubleStorage)
    assert torch.is_storage(s) and torch.is_storage(torch.tpu.LongStorage(1))
    assert torch.tpu.IntStorage([1, 2, 3]).tolist() == [1, 2, 3]


def test_typed_storage_of_tensor():
    def run(d):
        x = torch.arange(6, dtype=torch.int64, device=d)[2:]
        s = x.storage()
        return s.size(), s.tolist(), s.nbytes(), s.element_size()

    cpu, tpu = both(run)
    assert tpu == cpu


# ---- host copies of storages


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.complex64, torch.int16])
def test_untyped_storage_cpu_and_tolist(dtype):
    def run(d):
        x = torch.arange(6).to(dtype).to(d)[1::2]  # a view: its storage is the whole base's
        s = x.untyped_storage()
        return s.nbytes(), s.cpu().tolist(), s.tolist(), s.cpu().device.type

    cpu, tpu = both(run)
    assert tpu == cpu


def test_storage_copy_and_fill():
    def run(d):
        base = torch.zeros(4, dtype=torch.int32, device=d)
        s = base.untyped_storage()
        s.copy_(torch.arange(4, dtype=torch.int32).untyped_storage())
        s[4:8].fill_(9)
        return base

    assert_same(*both(run))


# ---- pickle and torch.save / torch.load


def save_load(obj, **kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **kwargs)


def pickle_roundtrip(obj):
    return pickle.loads(pickle.dumps(obj))


def shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("roundtrip", [pickle_roundtrip, save_load])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.bool])
def test_tensor_roundtrip(roundtrip, dtype):
    def run(d):
        x = torch.arange(5).to(dtype).to(d)
        y = roundtrip(x)
        return y, y.device.type

    cpu, tpu = both(run)
    assert_same(cpu[0], tpu[0])
    assert tpu[1] == TPU


@pytest.mark.parametrize("roundtrip", [pickle_roundtrip, save_load])
def test_views_still_share_after_roundtrip(roundtrip):
    def run(d):
        base = torch.arange(12.0, device=d)
        view = base.view(3, 4)[1:, ::2]
        a, b = roundtrip([base, view])
        b.fill_(-1)  # writes through to the loaded base when they still share
        return a, b, shares(a, b), b.storage_offset(), b.stride()

    cpu, tpu = both(run)
    assert_same(cpu, tpu)
    # torch.save keeps the sharing; pickle pickles each tensor's storage on its own (CPU too).
    assert tpu[2] == (roundtrip is save_load)


def test_roundtrip_of_tensor_on_storage_slice():
    def run(d):
        base = torch.arange(8.0, device=d)
        t = on_slice(base.untyped_storage()[8:24], torch.float32, (4,))
        u = save_load(t)
        u.fill_(0)  # its own storage now: the original base is untouched
        return u, base, u.untyped_storage().nbytes()

    assert_same(*both(run))


def test_save_load_state_dict():
    model = torch.nn.Linear(3, 2).to(TPU)
    loaded = save_load(model.state_dict())
    assert set(loaded) == {"weight", "bias"}
    for k, v in model.state_dict().items():
        assert loaded[k].device.type == TPU and torch.equal(loaded[k].cpu(), v.cpu())


@pytest.mark.parametrize("map_location", ["cpu", torch.device("cpu"), {"tpu:0": "cpu"}])
def test_load_tpu_tensors_to_cpu(map_location):
    base = torch.arange(6.0)
    a, b = save_load([base.to(TPU), base.to(TPU)[2:]], map_location=map_location)  # two storages
    assert a.device.type == "cpu" and torch.equal(a, base) and torch.equal(b, base[2:])
    d = base.to(TPU)
    a, b = save_load([d, d[2:]], map_location=map_location)
    assert a.device.type == "cpu" and shares(a, b) and torch.equal(b, base[2:])


@pytest.mark.parametrize("map_location", ["tpu", "tpu:0", torch.device(TPU, 0), lambda s, loc: s.to(device=TPU)])
def test_load_cpu_tensors_to_tpu(map_location):
    base = torch.arange(6.0)
    a, b = save_load([base, base[2:]], map_location=map_location)
    assert a.device.type == TPU and b.device.type == TPU and shares(a, b)
    assert torch.equal(a.cpu(), base) and torch.equal(b.cpu(), base[2:])
    b.fill_(0)
    assert torch.equal(a.cpu(), torch.tensor([0.0, 1, 0, 0, 0, 0]))


def test_load_to_missing_tpu_device_raises():
    with pytest.raises(RuntimeError, match="device_count"):
        save_load(torch.ones(2), map_location=f"tpu:{torch.tpu.device_count()}")


def test_slice_past_a_grown_buffers_array_is_not_read_as_the_whole_buffer():
    # After resize_ the parent's array keeps its 8 elements (the new bytes read as zeros); a
    # contiguous 8-element tensor on the slice of bytes 32..64 must not take the whole-buffer path.
    s = torch.arange(8.0, device=TPU).untyped_storage()
    s.resize_(64)
    t = on_slice(s[32:64], torch.float32, (8,))
    assert torch_tpu._C._arg_info(t)[2] is None
    assert torch.equal((t + 0).cpu(), torch.zeros(8))
    head = on_slice(s[0:32], torch.float32, (8,))
    assert torch.equal((head + 0).cpu(), torch.arange(8.0))


# ---- copy-on-write lazy clones (torch._lazy_clone) ---------------------------------------------


def _cow_states(*tensors) -> list[bool]:
    return [torch._C._is_cow_tensor(t) for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_lazy_clone_shares_until_a_write_then_each_side_owns_its_value(dtype):
    def run(device):
        t = torch.tensor([[0, 1], [2, 3]], device=device, dtype=dtype)
        address = torch._C._data_address(t)
        clone = t._lazy_clone()
        states = [_cow_states(t, clone), torch._C._data_address(clone) == address]
        total = t + clone  # reads do not copy
        states.append(_cow_states(t, clone))
        view = t.view(4)
        view += torch.ones(1, device=device, dtype=dtype)  # t copies; clone keeps the old value
        states += [_cow_states(t, view, clone), torch._C._data_address(clone) == address]
        before = clone.cpu().clone()
        clone += torch.ones(1, device=device, dtype=dtype)  # the last reference: no copy
        states += [_cow_states(clone), torch._C._data_address(clone) == address]
        return states, [x.cpu() for x in (t, before, clone, total)]

    (cpu_states, cpu_values), (tpu_states, tpu_values) = both(run)
    assert tpu_states == cpu_states
    for c, t in zip(cpu_values, tpu_values):
        assert torch.equal(t, c)


@pytest.mark.parametrize(
    "write",
    [
        lambda c: c.index_put_((torch.tensor([1, 3], device=c.device),), torch.tensor(7.0)),  # host tier / scatter
        lambda c: c.copy_(torch.ones(5)),
        lambda c: c[1:3].fill_(2.0),  # through a view
        lambda c: torch.add(c, 1, out=c),
    ],
    ids=["index_put_", "copy_", "view_fill_", "out="],
)
def test_a_write_to_a_lazy_clone_leaves_the_source_alone(write):
    def run(device):
        t = torch.arange(5.0, device=device)
        clone = t._lazy_clone()
        write(clone)
        return t.cpu(), clone.cpu()

    (cpu_t, cpu_clone), (tpu_t, tpu_clone) = both(run)
    assert torch.equal(tpu_t, cpu_t) and torch.equal(tpu_clone, cpu_clone)


def test_resizing_a_lazy_clone_keeps_its_value_and_the_sources():
    # (CPU's resize_ of a lazy clone trips an internal assert in c10's materializer)
    t = torch.arange(5.0, device=TPU)
    clone = t._lazy_clone()
    clone.resize_(7)
    assert not torch._C._is_cow_tensor(clone) and torch.equal(clone.cpu()[:5], torch.arange(5.0))
    clone.fill_(3.0)
    assert torch.equal(t.cpu(), torch.arange(5.0)) and torch.equal(clone.cpu(), torch.full((7,), 3.0))


def test_lazy_clone_keeps_autograd_and_raises_cpus_errors():
    x = torch.randn(3, device=TPU, requires_grad=True)
    (x._lazy_clone() * 2).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))
    cow = torch.arange(4, device=TPU)._lazy_clone()
    with pytest.raises(RuntimeError, match="Materializing a storage in the loop function of at::parallel_for"):
        torch._test_parallel_materialize(cow, 1, False)
    piece = on_slice(torch.arange(8.0, device=TPU).untyped_storage()[4:16], torch.float32, (3,))
    with pytest.raises(RuntimeError, match="storage slice"):
        piece._lazy_clone()
