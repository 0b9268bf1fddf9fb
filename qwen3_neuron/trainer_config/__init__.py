"""Every rank's build: a settled job -> the torchtitan `Trainer.Config` it trains with (`build`;
`data`: the `data` section as torchtitan's data loader configs). Checks nothing the plan checked.
"""
