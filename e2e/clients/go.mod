module github.com/rdmanet/rdmanet/e2e/clients

go 1.26.8

require (
	github.com/hashicorp/yamux v0.1.2
	github.com/rdmanet/rdmanet v0.0.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/stretchr/testify v1.12.1
	github.com/tidwall/redcon v1.6.4
	github.com/valyala/fasthttp v1.78.0
	golang.org/x/sync v0.25.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/libp2p/go-buffer-pool v0.1.0 // indirect
	github.com/molecule-man/go-brrr v1.3.1 // indirect
	github.com/tidwall/btree v1.1.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace github.com/rdmanet/rdmanet => ../..
