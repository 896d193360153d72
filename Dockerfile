# hoplink: one static binary for the operator and the relays.
# Built by hack/docker-build.sh, which compiles the binary first: nothing is
# pulled, so the image starts from scratch.
FROM scratch
COPY bin/image/hoplink /hoplink
# Relays and the operator need no privileges (TUN tunnels will, and say so).
USER 65532:65532
ENTRYPOINT ["/hoplink"]
