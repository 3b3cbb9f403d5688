# Every exported file hashed again against the base's tree (run by export_image_repo.sh as $VERIFY).
# ruff: noqa: E401, I001  # the one-line imports are the program as it ran, kept byte for byte

import hashlib, os, sys
root = sys.argv[1]
for record in sys.stdin.buffer.read().split(b"\0"):
    meta, _, path = record.partition(b"\t")
    if not path:
        continue
    mode, sha = meta.split()[:2]
    full = os.path.join(os.fsencode(root), path)
    if mode in (b"100644", b"100755"):
        with open(full, "rb") as handle:
            data = handle.read()
    elif mode == b"120000":
        data = os.readlink(full)
    else:
        continue  # a submodule's commit: no file
    if hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest().encode() != sha:
        sys.exit(f"{path!r} does not hash to {sha.decode()}")
