"""Mesh specs, sharding rules and launch settings, without devices: pure arithmetic on specs."""

import pytest
from jax.sharding import PartitionSpec as P

import zoo
from zoo.bench.scale import collectives
from zoo.errors import ZooError
from zoo.models.paths import flat_by_path
from zoo.parallel import MeshSpec, leaf_spec, param_specs, parse_mesh
from zoo.parallel.distributed import cluster_from


def test_mesh_flags_parse_and_resolve():
    assert parse_mesh("data=2,fsdp=4") == MeshSpec(2, 4, 1)
    assert parse_mesh("auto").resolve(8) == MeshSpec(8, 1, 1)
    assert parse_mesh("data=auto,tensor=2").resolve(8) == MeshSpec(4, 1, 2)
    assert str(MeshSpec(2, 1, 2)) == "data=2,tensor=2" and str(MeshSpec()) == "data=1"


@pytest.mark.parametrize(
    ("text", "devices", "match"),
    [
        ("data=2,pipe=2", 4, r"unknown mesh axis 'pipe'.*Valid: data, fsdp, tensor"),
        ("data=2,fsdp=2", 8, "has 4 devices, but 8 are present"),
        ("data=auto,tensor=3", 8, "does not divide the 8 devices"),
        ("fsdp=0", 1, "--mesh 'fsdp=0': fsdp must be a positive int, got '0'"),
        ("data=two", 2, "data must be a positive int or auto, got 'two'"),
        ("data=2,data=4", 8, "sets data twice"),
    ],
)
def test_bad_meshes_name_the_value_and_the_choices(text, devices, match):
    with pytest.raises(ZooError, match=match):
        parse_mesh(text).resolve(devices)


def test_fsdp_takes_the_largest_fitting_dimension_but_never_layers():
    mesh = MeshSpec(fsdp=4)
    assert leaf_spec(("layers", "embed", "mlp"), (4, 64, 256), mesh) == P(None, None, "fsdp")
    assert leaf_spec(("layers", "embed"), (8, 6), mesh) == P()  # nothing fits: replicated
    # a lookup table keeps its rows whole where another dimension fits
    assert leaf_spec(("vocab", "embed"), (512, 64), mesh, table=True) == P(None, "fsdp")


def test_tensor_splits_heads_and_mlp_megatron_style():
    cfg = zoo.get_config("llama-s")
    specs = flat_by_path(param_specs(cfg, MeshSpec(data=2, fsdp=2, tensor=2)))
    assert specs["blocks.attn.q.w"] == P(None, "fsdp", "tensor")  # column parallel
    assert specs["blocks.attn.o.w"] == P(None, "tensor", "fsdp")  # row parallel
    assert specs["blocks.mlp.down.w"] == P(None, "tensor", "fsdp")
    with pytest.raises(ZooError, match=r"tensor=8 does not divide blocks.attn.k.w's 'kv_heads'.*\[1, 2\]"):
        param_specs(cfg, MeshSpec(tensor=8))


def test_collectives_are_counted_from_hlo_text():
    hlo = """
  %all-gather.1 = f32[4,64]{1,0} all-gather(f32[1,64]{1,0} %p), dimensions={0}
  %ar = (f32[8]{0}, /*index=1*/f32[2,2]{1,0}) all-reduce-start(f32[8]{0} %a, f32[2,2]{1,0} %b), to_apply=%sum
  %ard = (f32[8]{0}, f32[2,2]{1,0}) all-reduce-done(%ar)
  %add = f32[8]{0} add(f32[8]{0} %x, f32[8]{0} %y)
"""
    counts = collectives(hlo)
    assert counts["all-gather"] == {"count": 1, "bytes": 4 * 64 * 4}
    assert counts["all-reduce"] == {"count": 1, "bytes": (8 + 4) * 4}
    assert counts["reduce-scatter"]["count"] == 0


def test_cluster_settings_from_flags_or_environment():
    assert cluster_from(environ={}) is None
    env = {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:9", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert cluster_from(environ=env).process_id == 1
    with pytest.raises(ZooError, match="--process-id 2 is outside 0..1"):
        cluster_from("127.0.0.1:9", 2, 2, environ={})
    with pytest.raises(ZooError, match="needs --num-processes"):
        cluster_from("127.0.0.1:9", environ={})
    with pytest.raises(ZooError, match="need --coordinator"):
        cluster_from(num_processes=2, environ={})
