"""A URL used without the extra that reads it names the extra to install (pip install
'stoker[remote]'), instead of fsspec's own message about aiohttp or s3fs. Each case runs in a
fresh interpreter where the backend's module cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _without(modules: list[str], code: str) -> subprocess.CompletedProcess[str]:
    program = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    program += textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    "url,missing",
    [
        ("http://127.0.0.1:9/packs/train", ["aiohttp"]),
        ("https://example.invalid/packs/train", ["aiohttp"]),
        ("s3://bucket/packs/train", ["s3fs"]),
        ("http://127.0.0.1:9/packs/train", ["fsspec"]),
    ],
)
def test_a_url_without_its_backend_names_the_extra(url, missing, tmp_path):
    done = _without(missing, f"""
        import stoker
        try:
            stoker.ImageLoader({url!r}, batch_size=2, cache_dir={str(tmp_path)!r})
        except ImportError as e:
            print("ImportError:", e)
        """)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ImportError:" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "pip install 'stoker[remote]'" in done.stdout, done.stdout
    assert url.split("://")[0] + "://" in done.stdout, done.stdout


def test_brace_notation_without_braceexpand_names_the_extra(tmp_path):
    done = _without(["braceexpand"], f"""
        import stoker
        try:
            stoker.ImageLoader("http://127.0.0.1:9/train-{{000..009}}.tar", batch_size=2,
                               cache_dir={str(tmp_path)!r})
        except ImportError as e:
            print("ImportError:", e)
        """)  # fmt: skip
    assert "brace notation needs braceexpand: pip install 'stoker[remote]'" in done.stdout, (
        done.stdout + done.stderr[-3000:]
    )
