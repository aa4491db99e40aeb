module ddp-operator/localcluster/kueue

go 1.25.0

require sigs.k8s.io/kueue v0.15.2 // indirect
