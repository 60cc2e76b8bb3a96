# Sourced by bench/run.sh and bench/ab.sh: builds the bench's function image,
# busybox cat (`Entrypoint: /bin/cat`), as an OCI layout with umoci.
#   cat_image WORK   -> $WORK/cat-layout (tag latest) and $WORK/input.yaml
cat_image() {
  local work=$1 layout=$1/cat-layout root=$1/stage/rootfs a
  printf 'observed: {}\ndesired: {}\n' > "$work/input.yaml"
  umoci init --layout "$layout"
  umoci new --image "$layout:latest"
  umoci unpack --image "$layout:latest" "$work/stage" >/dev/null
  mkdir -p "$root/bin" "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  cp /bin/busybox "$root/bin/busybox"
  for a in sh cat true; do ln -s busybox "$root/bin/$a"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
    > "$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' > "$root/etc/group"
  umoci repack --image "$layout:latest" "$work/stage"
  umoci config --image "$layout:latest" --clear=config.entrypoint --clear=config.cmd \
    --config.env=PATH=/bin --config.entrypoint=/bin/cat
  umoci gc --layout "$layout"
  rm -rf "$work/stage"
}
