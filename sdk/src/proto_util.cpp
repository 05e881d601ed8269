// (proto helpers arrive with the SDK)
