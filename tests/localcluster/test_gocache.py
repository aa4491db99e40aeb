"""localcluster/gocache.sh: each Go build compiles into a cache of its own, removed when it ends."""
import os
import subprocess
from pathlib import Path

HELPER = Path(__file__).resolve().parents[2] / "localcluster" / "gocache.sh"


def scope(cache: Path, command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs COMMAND (bash) through go_cache_scope with DDP_CACHE=cache, as the build scripts do."""
    script = f'set -euo pipefail\nDDP_CACHE="{cache}"\nsource "{HELPER}"\ngo_cache_scope bash -c \'{command}\''
    base = {k: v for k, v in os.environ.items() if k != "GOCACHE"}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**base, **(env or {})})


def test_a_build_compiles_into_its_own_folder_which_is_gone_afterwards(tmp_path: Path) -> None:
    # What Go itself reads as its build cache, and something written there, as a compile would.
    done = scope(tmp_path, 'go env GOCACHE; mkdir -p "$GOCACHE" && touch "$GOCACHE/object"')
    assert done.returncode == 0, done.stderr
    used = Path(done.stdout.strip())
    assert used.parent == tmp_path and used.name.startswith("go-build.")
    assert not used.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_failed_build_fails_and_leaves_no_folder(tmp_path: Path) -> None:
    done = scope(tmp_path, 'mkdir -p "$GOCACHE" && touch "$GOCACHE/object" && exit 3')
    assert done.returncode == 3
    assert list(tmp_path.iterdir()) == []


def test_the_folder_of_a_killed_build_is_removed_by_the_next(tmp_path: Path) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()  # reaped: no process has its pid now
    left = tmp_path / f"go-build.{ended.pid}"
    left.mkdir()
    (left / "object").touch()
    live = tmp_path / f"go-build.{os.getpid()}"  # a build still running keeps its folder
    live.mkdir()
    done = scope(tmp_path, "true")
    assert done.returncode == 0, done.stderr
    assert sorted(tmp_path.iterdir()) == [live]


def test_a_gocache_in_the_environment_is_used_and_kept(tmp_path: Path) -> None:
    kept = tmp_path / "kept-cache"
    done = scope(tmp_path, 'go env GOCACHE; mkdir -p "$GOCACHE" && touch "$GOCACHE/object"', {"GOCACHE": str(kept)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(kept)
    assert (kept / "object").exists()
