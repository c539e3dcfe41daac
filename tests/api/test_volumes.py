"""Volume lifecycle with dmsetup semantics."""

import httpx
import pytest

from tests.support.factories import make_device, make_volume, xts_table
from tests.support.keys import CBC_KEY, XTS_KEY

pytestmark = pytest.mark.anyio


@pytest.fixture
async def volume(client: httpx.AsyncClient) -> dict[str, object]:
    await make_device(client)
    return await make_volume(client)


async def test_create_activates_the_volume_with_a_live_table(volume: dict[str, object]) -> None:
    assert volume["state"] == "active"
    assert volume["tables"] == ["LIVE"]
    assert volume["size_sectors"] == 2048
    assert volume["dispatch_mode"] == "request"


async def test_volume_info_hides_keys(client: httpx.AsyncClient, volume: object) -> None:
    response = await client.get("/v1/volumes/vol")
    assert XTS_KEY not in response.text
    assert response.json()["targets"][0]["params"].startswith("aes-xts-plain64 " + "0" * 128)


async def test_table_prints_like_dmsetup_with_keys_zeroed(
    client: httpx.AsyncClient, volume: object
) -> None:
    response = await client.get("/v1/volumes/vol/table")
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == f"0 2048 crypt aes-xts-plain64 {'0' * 128} 0 sda2 0\n"


async def test_show_keys_prints_the_key_for_admin(
    client: httpx.AsyncClient, volume: object
) -> None:
    response = await client.get("/v1/volumes/vol/table", params={"show_keys": "true"})
    assert response.text == f"0 2048 crypt aes-xts-plain64 {XTS_KEY} 0 sda2 0\n"


async def test_show_keys_is_refused_to_the_io_token(
    io_client: httpx.AsyncClient, volume: object
) -> None:
    response = await io_client.get("/v1/volumes/vol/table", params={"show_keys": "true"})
    assert response.status_code == 403


async def test_bad_table_is_a_422_naming_line_and_field_without_the_key(
    client: httpx.AsyncClient,
) -> None:
    await make_device(client)
    short_key = XTS_KEY[:62]
    table = f"0 2048 crypt aes-xts-plain64 {short_key} 0 sda2 0"
    response = await client.post("/v1/volumes", json={"name": "v", "table": table})
    assert response.status_code == 422
    body = response.json()
    assert body["detail"].startswith("line 1: crypt")
    assert short_key not in response.text
    assert (await client.get("/v1/volumes/v")).status_code == 404


async def test_table_beyond_the_device_is_refused(client: httpx.AsyncClient) -> None:
    await make_device(client, size=1 << 20)
    response = await client.post(
        "/v1/volumes", json={"name": "v", "table": xts_table(sectors=4096)}
    )
    assert response.status_code == 422


async def test_unknown_device_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/volumes", json={"name": "v", "table": xts_table("nope")})
    assert response.status_code == 422  # the table is invalid; no resource is missing
    assert "nope" in response.json()["detail"]


async def test_load_then_resume_swaps_the_inactive_table_in(
    client: httpx.AsyncClient, volume: object
) -> None:
    new_table = f"0 1024 crypt aes-cbc-essiv:sha256 {CBC_KEY} 0 sda2 0\n"
    response = await client.put(
        "/v1/volumes/vol/table", content=new_table, headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 204
    assert (await client.get("/v1/volumes/vol")).json()["tables"] == ["LIVE", "INACTIVE"]
    await client.post("/v1/volumes/vol/suspend")
    resumed = await client.post("/v1/volumes/vol/resume")
    assert resumed.json()["tables"] == ["LIVE"]
    assert resumed.json()["size_sectors"] == 1024
    table = await client.get("/v1/volumes/vol/table", params={"show_keys": "true"})
    assert table.text == new_table


async def test_clearing_the_inactive_table(client: httpx.AsyncClient, volume: object) -> None:
    await client.put("/v1/volumes/vol/table", json={"table": xts_table(sectors=1024)})
    assert (await client.delete("/v1/volumes/vol/table")).status_code == 204
    assert (await client.get("/v1/volumes/vol")).json()["tables"] == ["LIVE"]


async def test_key_messages_need_a_suspended_volume(
    client: httpx.AsyncClient, volume: object
) -> None:
    response = await client.post("/v1/volumes/vol/message", json={"message": "key wipe"})
    assert response.status_code == 409


async def test_resume_after_key_wipe_is_refused_until_key_set(
    client: httpx.AsyncClient, volume: object
) -> None:
    await client.post("/v1/volumes/vol/suspend")
    assert (
        await client.post("/v1/volumes/vol/message", json={"message": "key wipe"})
    ).status_code == 204
    refused = await client.post("/v1/volumes/vol/resume")
    assert refused.status_code == 409
    assert "crypt key is not set" in refused.json()["detail"]
    key_set = await client.post("/v1/volumes/vol/message", json={"message": f"key set {XTS_KEY}"})
    assert key_set.status_code == 204
    assert (await client.post("/v1/volumes/vol/resume")).status_code == 200


async def test_wiped_key_prints_as_zeros_of_its_length_like_the_kernel(
    client: httpx.AsyncClient, volume: object
) -> None:
    await client.post("/v1/volumes/vol/suspend")
    await client.post("/v1/volumes/vol/message", json={"message": "key wipe"})
    table = await client.get("/v1/volumes/vol/table", params={"show_keys": "true"})
    assert table.text == f"0 2048 crypt aes-xts-plain64 {'0' * 128} 0 sda2 0\n"


async def test_key_set_with_a_wrong_length_is_refused_without_echo(
    client: httpx.AsyncClient, volume: object
) -> None:
    await client.post("/v1/volumes/vol/suspend")
    response = await client.post(
        "/v1/volumes/vol/message", json={"message": "key set abcdef0123456789"}
    )
    assert response.status_code == 422
    assert "abcdef0123456789" not in response.text


async def test_rename_keeps_the_volume(client: httpx.AsyncClient, volume: object) -> None:
    response = await client.post("/v1/volumes/vol/rename", json={"new_name": "renamed"})
    assert response.status_code == 200
    assert (await client.get("/v1/volumes/vol")).status_code == 404
    assert (await client.get("/v1/volumes/renamed")).json()["state"] == "active"


async def test_stacked_volume_maps_another_volume_and_blocks_its_removal(
    client: httpx.AsyncClient, volume: object
) -> None:
    await make_volume(client, "upper", table="0 2048 linear /dev/mapper/vol 0")
    assert (await client.get("/v1/volumes/vol")).json()["open_count"] == 1
    assert (await client.delete("/v1/volumes/vol")).status_code == 409
    assert (await client.delete("/v1/volumes/upper")).status_code == 204
    assert (await client.get("/v1/volumes/vol")).json()["open_count"] == 0
    assert (await client.delete("/v1/volumes/vol")).status_code == 204


async def test_rename_is_refused_while_a_live_table_maps_the_volume(
    client: httpx.AsyncClient, volume: object
) -> None:
    await make_volume(client, "upper", table="0 2048 linear /dev/mapper/vol 0")
    response = await client.post("/v1/volumes/vol/rename", json={"new_name": "lower"})
    assert response.status_code == 409
    assert "upper" in response.json()["detail"]


async def test_rename_is_refused_while_an_inactive_table_maps_the_volume(
    client: httpx.AsyncClient, volume: object
) -> None:
    """The inactive table names the volume too: renaming it would leave that table dangling."""
    await make_volume(client, "upper", table="0 2048 zero")
    loaded = await client.put(
        "/v1/volumes/upper/table", json={"table": "0 2048 linear /dev/mapper/vol 0"}
    )
    assert loaded.status_code == 204
    response = await client.post("/v1/volumes/vol/rename", json={"new_name": "lower"})
    assert response.status_code == 409
    assert "upper" in response.json()["detail"]
    assert (await client.get("/v1/volumes/vol")).status_code == 200


async def test_open_count_counts_every_table_that_maps_the_volume(
    client: httpx.AsyncClient, volume: object
) -> None:
    """As in the kernel, loading a table opens its devices: inactive tables count too."""
    await make_volume(client, "upper", table="0 2048 zero")
    await client.put("/v1/volumes/upper/table", json={"table": "0 2048 linear /dev/mapper/vol 0"})
    assert (await client.get("/v1/volumes/vol")).json()["open_count"] == 1
    await client.delete("/v1/volumes/upper/table")
    assert (await client.get("/v1/volumes/vol")).json()["open_count"] == 0


async def test_remove_and_device_delete_are_refused_while_an_inactive_table_maps_them(
    client: httpx.AsyncClient, volume: object
) -> None:
    await make_volume(client, "upper", table="0 2048 zero")
    await client.put("/v1/volumes/upper/table", json={"table": "0 2048 linear /dev/mapper/vol 0"})
    assert (await client.delete("/v1/volumes/vol")).status_code == 409
    await make_device(client, "spare")
    await client.put("/v1/volumes/upper/table", json={"table": xts_table("spare")})
    assert (await client.delete("/v1/devices/spare")).status_code == 409


async def test_a_volume_cannot_map_itself(client: httpx.AsyncClient, volume: object) -> None:
    response = await client.put(
        "/v1/volumes/vol/table", json={"table": "0 2048 linear /dev/mapper/vol 0"}
    )
    assert response.status_code == 422
    assert "itself" in response.json()["detail"] or "vol" in response.json()["detail"]


async def test_patch_switches_dispatch_mode_live(client: httpx.AsyncClient, volume: object) -> None:
    response = await client.patch("/v1/volumes/vol", json={"dispatch_mode": "bio"})
    assert response.status_code == 200
    assert response.json()["dispatch_mode"] == "bio"


async def test_queue_limits_are_the_kernel_defaults(volume: dict[str, object]) -> None:
    assert volume["queue_limits"] == {
        "max_sectors_kb": 1280,
        "max_segments": 128,
        "max_segment_size": 65536,
        "logical_block_size": 512,
        "nomerges": 0,
        "nr_requests": 128,
    }


async def test_status_has_iostat_fields(client: httpx.AsyncClient, volume: object) -> None:
    body = (await client.get("/v1/volumes/vol/status")).json()
    assert body["status"] == "0 2048 crypt \n"
    for key in ("r_ios", "w_ios", "r_bios", "w_bios", "r_merges", "w_merges", "engine_calls"):
        assert key in body["stats"]


async def test_force_remove_replaces_the_table_with_error_first(
    client: httpx.AsyncClient, volume: object
) -> None:
    response = await client.delete("/v1/volumes/vol", params={"force": "true"})
    assert response.status_code == 204
    assert (await client.get("/v1/volumes/vol")).status_code == 404
    assert (await client.get("/v1/devices/sda2")).json()["mapped_by"] == []


async def test_remove_of_an_unknown_volume_is_404(client: httpx.AsyncClient) -> None:
    response = await client.delete("/v1/volumes/nope")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


async def test_elevator_and_queue_limits_are_retuned_live(
    client: httpx.AsyncClient, volume: object
) -> None:
    response = await client.patch(
        "/v1/volumes/vol",
        json={"elevator": "mq-deadline", "queue_limits": {"max_sectors_kb": 256, "nomerges": 2}},
    )
    assert response.status_code == 200
    body = response.json()
    assert body["elevator"] == "mq-deadline"
    assert body["queue_limits"]["max_sectors_kb"] == 256
    assert body["queue_limits"]["nomerges"] == 2


async def test_plug_window_is_per_volume_and_retuned_live(
    client: httpx.AsyncClient, volume: dict[str, object]
) -> None:
    assert volume["plug_window_us"] == 50
    response = await client.patch("/v1/volumes/vol", json={"plug_window_us": 3000})
    assert response.json()["plug_window_us"] == 3000


async def test_crypt_split_is_unset_by_default_then_per_volume_and_retuned_live(
    client: httpx.AsyncClient, volume: dict[str, object]
) -> None:
    assert volume["crypt_split"] == {"max_read_size": None, "max_write_size": None}
    response = await client.patch(
        "/v1/volumes/vol", json={"crypt_split": {"max_read_size": 128 << 10}}
    )
    assert response.status_code == 200, response.text
    assert response.json()["crypt_split"] == {"max_read_size": 131072, "max_write_size": None}
    response = await client.patch(
        "/v1/volumes/vol", json={"crypt_split": {"max_write_size": 64 << 10}}
    )
    assert response.json()["crypt_split"] == {"max_read_size": 131072, "max_write_size": 65536}


async def test_a_volume_is_created_with_its_own_crypt_split(client: httpx.AsyncClient) -> None:
    await make_device(client)
    body = await make_volume(client, crypt_split={"max_read_size": 4096, "max_write_size": 8192})
    assert body["crypt_split"] == {"max_read_size": 4096, "max_write_size": 8192}


@pytest.mark.parametrize("size", [6000, 0, 2048, 1 << 31])
async def test_a_split_size_that_is_not_whole_pages_is_refused(
    client: httpx.AsyncClient, volume: object, size: int
) -> None:
    response = await client.patch("/v1/volumes/vol", json={"crypt_split": {"max_read_size": size}})
    assert response.status_code == 422
    assert "max_read_size" in response.json()["detail"]
    assert (await client.get("/v1/volumes/vol")).json()["crypt_split"]["max_read_size"] is None


async def test_nonsense_queue_limits_are_refused(client: httpx.AsyncClient, volume: object) -> None:
    response = await client.patch(
        "/v1/volumes/vol", json={"queue_limits": {"logical_block_size": 1000}}
    )
    assert response.status_code == 422
    assert "logical_block_size" in response.json()["detail"]


async def test_queue_depth_comes_from_the_device_model(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/devices", json={"name": "mmc", "size_bytes": 1 << 20, "model": "sdcard-bbb"}
    )
    assert response.status_code == 201, response.text
    body = await make_volume(client, name="card", table=xts_table(device="mmc"))
    assert body["queue_depth"] == 1


async def test_a_device_without_a_model_gets_the_default_queue_depth(
    volume: dict[str, object],
) -> None:
    assert volume["queue_depth"] == 32
