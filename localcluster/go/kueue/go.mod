module ddp-operator/localcluster/kueue

go 1.26.0

require sigs.k8s.io/kueue v0.19.2 // indirect
