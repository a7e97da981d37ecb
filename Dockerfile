# The leasehold binary in a small image, for compose.yaml.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --bin leasehold

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/leasehold /usr/local/bin/leasehold
USER 65534:65534
ENTRYPOINT ["leasehold"]
