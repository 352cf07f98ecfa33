module github.com/haptic-agent/haptic

go 1.26

require github.com/klauspost/compress v1.20.4
