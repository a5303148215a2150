module proflow.test/peers/apps/goscrape

go 1.24
