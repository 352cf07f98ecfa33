# The haptic binary in a minimal image: built static (no cgo) in a Go
# image, then copied alone into a distroless base that has no shell and
# runs as a non-root user. deploy/kubernetes runs it as the agent and, to
# hand the binary to HAProxy's preStop hook, as "haptic install".
#
#   docker build --build-arg VERSION=v1.2.0 -t haptic .
#
# VERSION is what `haptic version`, the agent's state and its
# haptic_agent_build_info report. The build context holds no .git
# (.dockerignore), so without it the image reports "dev".

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/haptic ./cmd/haptic

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/haptic /usr/local/bin/haptic
USER 65532:65532
EXPOSE 5555 9101
ENTRYPOINT ["/usr/local/bin/haptic"]
CMD ["agent"]
