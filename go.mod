module github.com/rdmanet/rdmanet

go 1.25.0

require (
	github.com/libp2p/go-buffer-pool v0.1.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/net v0.58.0
	golang.org/x/sys v0.47.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
