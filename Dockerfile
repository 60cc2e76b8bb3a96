# syntax=docker/dockerfile:1
#
# The fnrun image: the static release binary and nothing it does not need.
#
# It builds offline (FROM scratch, no RUN step) from a small build context that
# scripts/build-image prepares:
#
#   fnrun                      the static release binary (crt-static, any libc)
#   rootfs/etc/passwd, group   root and the unprivileged fnrun user (65532)
#   rootfs/etc/ssl/certs/ca-certificates.crt
#                              CA certificates, for registries over HTTPS
#   rootfs/usr/share/man/man1/fnrun*.1
#                              the man pages (`fnrun man --output-dir`)
#   rootfs/tmp/                empty, mode 1777
#   empty/                     an empty directory, copied as the image cache
#                              /var/cache/fnrun (a hostPath in deploy/) and the
#                              socket directory /var/run/fnrun, owned by 65532
#
#   scripts/build-image        # buildah bud ... -t fnrun:dev
#
# It runs as the unprivileged user 65532 by default (the rootless mode: the
# runner's own uid is mapped to root in each function's user namespace). The
# root mode, which maps 65536 ids per run and enforces cgroup limits, runs it as
# uid 0 with CAP_SETUID and CAP_SETGID: see docs/deployment.md.
FROM scratch

COPY rootfs/ /
COPY --chown=65532:65532 empty/ /var/cache/fnrun/
COPY --chown=65532:65532 empty/ /var/run/fnrun/
COPY fnrun /usr/local/bin/fnrun

ENV FNRUN_CACHE_DIR=/var/cache/fnrun \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    HOME=/var/cache/fnrun

USER 65532:65532
WORKDIR /
# The default listener is the abstract unix socket
# unix-abstract:crossplane/fn/default.sock; deploy/ adds gRPC over TCP on 9443
# (--listen 0.0.0.0:9443) and metrics on 9090 (--metrics-listen 0.0.0.0:9090).
EXPOSE 9443 9090
ENTRYPOINT ["/usr/local/bin/fnrun"]
CMD ["serve"]

LABEL org.opencontainers.image.title="fnrun" \
      org.opencontainers.image.description="Rootless container function runner for Crossplane composition functions" \
      org.opencontainers.image.source="https://github.com/fnrun/fnrun" \
      org.opencontainers.image.licenses="Apache-2.0"
