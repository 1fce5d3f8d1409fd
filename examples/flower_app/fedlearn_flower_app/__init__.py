"""A fedlearn_edu strategy as a Flower App (ServerApp + ClientApp)."""
