"""torch DataLoader + Pillow-SIMD: dataloader_pil's recipe with Pillow replaced by Pillow-SIMD,
built from its PyPI source with AVX2 (the SIMD resize; decoding is the same libjpeg-turbo)."""

from __future__ import annotations

import _common
import _dataloader
import dataloader_pil

ENV = {
    "torch": True,
    "pip": ["numpy"],
    "apt": ["build-essential", "libjpeg62-turbo-dev", "zlib1g-dev"],
    "build": [
        "$PY -m pip uninstall -y -q pillow pillow-simd || true",
        'CC="cc -mavx2" $PY -m pip install -q --no-cache-dir --no-binary pillow-simd'
        " --force-reinstall pillow-simd",
    ],
}


def version():
    import PIL

    if ".post" not in PIL.__version__:  # Pillow-SIMD's versions are Pillow's plus .postN
        raise SystemExit(f"PIL {PIL.__version__} is Pillow, not Pillow-SIMD")
    return f"Pillow-SIMD {PIL.__version__} (built with -mavx2), {_dataloader.torch_version()}"


if __name__ == "__main__":
    raise SystemExit(
        _common.main(
            "DataLoader + Pillow-SIMD",
            dataloader_pil.make_epoch,
            version=version,
            notes="torchvision's PIL transforms exactly (same code as DataLoader + PIL); "
            "Pillow-SIMD's AVX2 bilinear resize may differ from Pillow's by 1 in a few pixels.",
        )
    )
